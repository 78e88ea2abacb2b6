"""Decode step of a draft model over the target's, both loaded in one process and timed in turns
(so that a drift of the machine's memory bandwidth hits both alike).

    python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct

A step is one single-token forward with logits at a 256-token context, as plain decoding runs it.
Prints per round each model's median step (ms) and their ratio, then the median and range of the
ratios over rounds."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def step_ms(eng, steps: int) -> float:
    runner, kv = eng.runner, eng.kv
    with kv.scratch_slot() as slot:
        runner.forward([slot], [list(range(100, 356))], logits=False)
        kv.set_length(slot, 256)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            logits, _, _ = runner.forward([slot], [[5]], last_only=True)
            int(logits[0].argmax())
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    a = ap.parse_args()
    from specdecode.config import EngineConfig, SpecConfig
    from specdecode.engine.engine import Engine

    torch.set_num_threads(a.threads)
    none = SpecConfig(spec_type="none")
    engines = [Engine(EngineConfig(model=m, threads=a.threads, max_num_seqs=1, max_model_len=1024, spec=none))
               for m in (a.target, a.draft)]
    for e in engines:
        step_ms(e, 4)  # warm-up
    ratios = []
    for r in range(a.rounds):
        t, d = (step_ms(e, a.steps) for e in engines)
        ratios.append(d / t)
        print(json.dumps({"round": r, "target_ms": round(t, 2), "draft_ms": round(d, 2), "ratio": round(d / t, 3)}))
    print(json.dumps({"ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
                      "ratio_max": round(max(ratios), 3)}))


if __name__ == "__main__":
    main()
