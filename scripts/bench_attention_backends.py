"""The attention backends side by side on one model, interleaved: a decode step, a verify forward of
5 and 9 tokens, a batch of 4 one-token rows, at two context lengths, and a 512-token prefill (medians
of 5 / 3 runs, milliseconds).

    python scripts/bench_attention_backends.py --model qwen2.5-coder-1.5b-instruct --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdecode.config import EngineConfig, SpecConfig
from specdecode.engine.engine import Engine
from specdecode.runtime import attention

NAMES = ("torch-sdpa", "cpu-native")


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(a) -> None:
    eng = Engine(EngineConfig(model=a.model, spec=SpecConfig(spec_type="none"), max_num_seqs=8, threads=a.threads))
    r, kv = eng.runner, eng.kv
    backends = {n: attention.backend(n) for n in NAMES}
    slots = [kv.allocate() for _ in range(4)]
    for ctx in (256, 1024):
        for s in slots:  # a context of ctx tokens in each slot
            kv.set_length(s, 0)
            r.forward([s], [[7] * ctx], logits=False)
            kv.set_length(s, ctx)
        for name in NAMES * a.rounds:
            r.attention = backends[name]
            row = {f"v({t})": median_ms(lambda: r.forward(slots[:1], [[5] * t], row_exact=True), 5) for t in (1, 5, 9)}
            row["batch 4"] = median_ms(lambda: r.forward(slots, [[5]] * 4), 5)
            print(f"ctx {ctx:5d}  {name:10s}  " + "  ".join(f"{k} {v:6.1f}" for k, v in row.items()), flush=True)
    s = kv.allocate()

    def prefill():
        kv.set_length(s, 0)
        r.forward([s], [[7] * 512], logits=False)
    for name in NAMES * a.rounds:
        r.attention = backends[name]
        print(f"prefill 512  {name:10s}  {median_ms(prefill, 3):7.0f}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per backend")
    main(p.parse_args())
