"""The 1.5B's whole forward over t = 1, 5, 9 new tokens after a 256-token context, as a verify runs it
(row_exact), rounds interleaving t; prints the medians (first two rounds dropped) and v(t)/v(1). Shorter
than bench_runtime.py's curve, for A/B runs of a code change in turns (one process each):

    python scripts/bench_verify_curve.py --rounds 21; git stash; python scripts/bench_verify_curve.py --rounds 21; git stash pop
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
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine

    eng = Engine(EngineConfig(model=a.model, quant="auto", threads=a.threads, max_model_len=1024))
    runner, kv = eng.runner, eng.kv
    prompt = torch.randint(0, 100000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    slot = kv.allocate()
    runner.forward([slot], [prompt], last_only=True)
    times = {t: [] for t in (1, 5, 9)}
    for _ in range(a.rounds):
        for t in times:
            kv.set_length(slot, len(prompt))
            t0 = time.perf_counter()
            runner.forward([slot], [prompt[:t]], row_exact=True)
            times[t].append(time.perf_counter() - t0)
    med = {t: statistics.median(v[2:]) for t, v in times.items()}
    print(" ".join(f"v({t})={m * 1e3:.2f}ms" for t, m in med.items()),
          f"v5/v1={med[5] / med[1]:.3f} v9/v1={med[9] / med[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
