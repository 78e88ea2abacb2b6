"""What verify rows cost in a batch: packed forwards of --batch sequences (each over a --context-token
prefix) with 0 .. batch + 2 extra rows (one drafted token on the first sequences, then a second) and
their greedy argmaxes, as a greedy speculative step runs them, medians of --reps. At batch 8 a drafted
token adds 1/8 of the step's tokens if accepted, so its row pays only where it costs less than that
times its acceptance.

    python scripts/bench_batch_rows.py --batch 8
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
    from specdecode.llm import LLM
    from specdecode.sampling import argmax_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    eng = LLM(a.model, spec_type="none", max_num_seqs=a.batch, threads=a.threads).engine
    kv, run = eng.kv, eng.runner
    slots = [kv.allocate() for _ in range(a.batch)]
    for s in slots:
        run.forward([s], [[100 + i % 50 for i in range(a.context)]], logits=False)
        kv.set_length(s, a.context)
    times: dict[int, list[float]] = {}
    for _ in range(a.reps):
        for extra in range(a.batch + 3):  # rows in turns, so drift reaches them alike
            rows = [[5] * (1 + (b < extra) + (b < extra - a.batch)) for b in range(a.batch)]
            t0 = time.perf_counter()
            argmax_rows(run.forward(slots, rows, row_exact=True, packed_logits=True)[0])
            times.setdefault(a.batch + extra, []).append(time.perf_counter() - t0)
    base = statistics.median(times[a.batch])
    for rows, ts in times.items():
        m = statistics.median(ts)
        print(f"batch {a.batch}, {rows:2d} rows: {1000 * m:6.1f} ms ({1000 * min(ts):.1f}-{1000 * max(ts):.1f}), "
              f"{m / base:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
