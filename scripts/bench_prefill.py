"""Prefill tok/s of the 1.5B at several prompt lengths, each prompt one forward (as one prefill chunk
runs), lengths interleaved over the rounds; prints the median per length (first round dropped). It
imports the checkout it sits in, so two worktrees run in turns give an A/B of a code change:

    git worktree add /tmp/wt_before <commit>
    for i in 1 2 3; do python /tmp/wt_before/scripts/bench_prefill.py; python scripts/bench_prefill.py; done
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="64,200,512", help="comma-separated prompt lengths (tokens)")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine

    lengths = [int(x) for x in a.lengths.split(",")]
    eng = Engine(EngineConfig(model=a.model, quant="auto", threads=a.threads, max_model_len=max(lengths) + 64))
    gen = torch.Generator().manual_seed(0)
    prompts = {n: torch.randint(0, eng.model.cfg.vocab_size - 1000, (n,), generator=gen).tolist() for n in lengths}
    slot = eng.kv.allocate()
    times = {n: [] for n in lengths}
    for _ in range(a.rounds + 1):
        for n, prompt in prompts.items():
            eng.kv.set_length(slot, 0)
            t0 = time.perf_counter()
            eng.runner.forward([slot], [prompt], last_only=True)
            times[n].append(time.perf_counter() - t0)
    print(f"{Path(__file__).resolve().parents[1]}: " +
          "  ".join(f"{n} tokens {n / statistics.median(t[1:]):.1f} tok/s" for n, t in times.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
