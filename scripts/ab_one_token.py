"""One sequence's lean forward (LlamaModel.few_tokens) against the batched fused path it bypasses, in
one process, in turns (ABBA), so that the host's drift hits both alike: per model, a round is --steps
forwards of --rows tokens (1: a decode step; more: a chain's verify) with logits and an argmax per
row at a 256-token context (as bench_step_ratio.py times a step), once each way. Prints each round
and the median and range of the paired ratios (lean / batched), and each way's time outside the
native layer and GEMM calls (the part the lean path changes, which the host's bandwidth drift leaves
alone); the two paths give the same bits (tests/test_fused_layer.py).

    python scripts/ab_one_token.py --models qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct
    python scripts/ab_one_token.py --models qwen2.5-coder-1.5b-instruct --rows 2
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def steps_ms(runner, slot: int, steps: int, native: collections.Counter, rows: int = 1) -> tuple[float, float]:
    """Median ms of one forward of ``rows`` tokens with logits, then their argmaxes, after 256 of
    context, and the mean ms of it outside the native calls that ``native`` accumulates."""
    from specdecode.sampling import argmax_rows  # the engine's greedy pick

    kv = runner.kv
    kv.set_length(slot, 256)
    times, tok = [], 5
    native.clear()
    for i in range(steps):
        t0 = time.perf_counter()
        if rows == 1:
            logits, _, _ = runner.forward([slot], [[tok]], last_only=True)
        else:  # a verify's shape: a chain of rows, their logits packed
            chain = [tok] + [(tok + j) % 1000 for j in range(1, rows)]
            logits, _, _ = runner.forward([slot], [chain], packed_logits=True)
        tok = int(argmax_rows(logits)[0])
        times.append(time.perf_counter() - t0)
        kv.set_length(slot, 257 + i)
    return statistics.median(times) * 1e3, (sum(times) - sum(native.values())) / steps * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-coder-1.5b-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rows", type=int, default=1, help="tokens per forward (1: a decode step)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from bench_batch_drafters import timed
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine
    from specdecode.kernels import NativeKernels

    native_s = collections.Counter()
    for name in ("decoder_layers", "int4_gemm", "int8_gemm"):
        timed(NativeKernels, name, name, native_s)

    for name in a.models.split(","):
        eng = Engine(EngineConfig(model=name, threads=a.threads, max_num_seqs=1, max_model_len=1024))
        runner, native = eng.runner, eng.model._native
        slot = eng.kv.allocate()
        runner.forward([slot], [list(range(100, 356))], logits=False)
        lean = native.few_tokens

        def batched_path(*args, **kw):
            return None

        ways = {"lean": lean, "batched": batched_path}
        for way in ways.values():  # warm-up
            native.few_tokens = way
            steps_ms(runner, slot, 4, native_s, a.rows)
        times, outside = {k: [] for k in ways}, {k: [] for k in ways}
        for r in range(a.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for k in order:
                native.few_tokens = ways[k]
                t, o = steps_ms(runner, slot, a.steps, native_s, a.rows)
                times[k].append(t)
                outside[k].append(o)
            print(f"{name} round {r}: lean {times['lean'][-1]:.2f} ms, batched {times['batched'][-1]:.2f} ms",
                  flush=True)
        native.few_tokens = lean
        ratios = [x / y for x, y in zip(times["lean"], times["batched"])]
        diffs = [y - x for x, y in zip(times["lean"], times["batched"])]
        print(f"{name}: lean {statistics.median(times['lean']):.2f} ms,"
              f" batched {statistics.median(times['batched']):.2f} ms;"
              f" lean / batched {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}),"
              f" saved {statistics.median(diffs):.2f} ms ({min(diffs):.2f}-{max(diffs):.2f});"
              f" outside the native calls: lean {statistics.median(outside['lean']):.3f} ms"
              f" ({min(outside['lean']):.3f}-{max(outside['lean']):.3f}), batched"
              f" {statistics.median(outside['batched']):.3f} ms ({min(outside['batched']):.3f}-"
              f"{max(outside['batched']):.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
