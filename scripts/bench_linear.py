"""Time one linear layer per weight format at decode-sized batches (1..9 rows) on CPU.

    python scripts/bench_linear.py [--threads 2] [--rounds 15] [--max-rows 9] [--shapes q_o,kv,...]

Shapes are Qwen2.5-1.5B's (hidden 1536, 2 KV heads of 128, intermediate 8960, vocab 151936).
Decode streams every weight from DRAM once per step, so each format cycles through enough copies of
the weight (>= 256 MiB together, 8x the 32 MiB L3) that no call finds its weight in cache. Formats
and row counts are run round-robin, ~10 ms per cell per round, so that load from other users of the
machine hits them alike; each cell is the median of all its calls (and the 10th percentile).
"kernel" rows call the torch op on bf16 activations; "layer" rows call the Int8Linear / Int4Linear
forward on float32 activations, i.e. with the casts the model pays.
GB/s = weight bytes (with scales/zeros) / time.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdecode.layers.quant import Int4Linear, Int8Linear  # noqa: E402

SHAPES = {  # name: (in_features, out_features, uses per decode step of the 28-layer model)
    "q_o": (1536, 1536, 28),  # o_proj (q_proj is packed into qkv)
    "kv": (1536, 256, 0),
    "qkv": (1536, 2048, 28),
    "gate_up": (1536, 2 * 8960, 28),
    "down": (8960, 1536, 28),
    "lm_head": (1536, 151936, 1),
}
ROTATE_BYTES = 256 << 20
ROUND_SECONDS = 0.01


def formats(w: torch.Tensor) -> dict[str, tuple[int, object, bool]]:
    """name -> (weight bytes, make: () -> a callable on x holding its own copy of the weight,
    whether x is bf16)."""
    n, k = w.shape
    w16 = w.to(torch.bfloat16)
    out = {"fp32 F.linear": (4 * n * k, lambda: partial(F.linear, weight=w.clone()), False),
           "bf16 F.linear": (2 * n * k, lambda: partial(F.linear, weight=w16.clone()), True)}
    i8 = Int8Linear.from_float(w)
    unit = torch.ones(n, dtype=torch.bfloat16)

    def int8_kernel(x, m):
        return torch.ops.aten._weight_int8pack_mm(x, m.qweight, unit)

    def int4_kernel(x, m):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, m.qweight, m.group_size, m.qparams.view(torch.bfloat16))
    out["int8 kernel"] = (n * k + 4 * n, lambda: partial(int8_kernel, m=copy.deepcopy(i8)), True)
    out["int8 layer"] = (n * k + 4 * n, lambda: copy.deepcopy(i8), False)
    for g in (32, 128):
        i4 = Int4Linear.from_float(w, group_size=g)
        nbytes = n * k // 2 + 4 * n * k // g
        out[f"int4-g{g} kernel"] = (nbytes, lambda i4=i4: partial(int4_kernel, m=copy.deepcopy(i4)), True)
        out[f"int4-g{g} layer"] = (nbytes, lambda i4=i4: copy.deepcopy(i4), False)
    return out


def bench_shape(k: int, n: int, rounds: int, max_rows: int) -> dict[str, dict]:
    """-> format -> {"bytes", "t": rows -> median us, "p10": rows -> 10th percentile us}."""
    w = torch.randn(n, k) * 0.02
    # Enough independent copies of each weight that a round never finds one in cache.
    fmts = {f: (nb, [make() for _ in range(math.ceil(ROTATE_BYTES / nb))], bf16)
            for f, (nb, make, bf16) in formats(w).items()}
    del w
    xs = {rows: torch.randn(rows, k) for rows in range(1, max_rows + 1)}
    xs = {rows: (x, x.to(torch.bfloat16)) for rows, x in xs.items()}
    samples = {(f, rows): [] for f in fmts for rows in xs}
    reps, calls = {}, dict.fromkeys(fmts, 0)
    with torch.no_grad():
        for f, (nb, fns, bf16) in fmts.items():  # warm up: touch every copy once, estimate the time
            for rows, x in xs.items():
                fns[0](x[bf16])
            t0 = time.perf_counter()
            for fn in fns:
                fn(xs[1][bf16])
            reps[f] = max(2, min(2000, int(ROUND_SECONDS * len(fns) / (time.perf_counter() - t0))))
        # Every round visits every (rows, format) cell, in a rotating order: a burst of load from
        # other users spreads over all cells instead of spoiling one.
        cells = [(rows, f) for rows in xs for f in fmts]
        for r in range(rounds):
            shift = r * len(cells) // rounds
            for rows, f in cells[shift:] + cells[:shift]:
                nb, fns, bf16 = fmts[f]
                x = xs[rows][bf16]
                for _ in range(reps[f]):
                    fn = fns[calls[f] % len(fns)]
                    calls[f] += 1
                    t0 = time.perf_counter_ns()
                    fn(x)
                    samples[f, rows].append(time.perf_counter_ns() - t0)
    results = {f: {"bytes": nb, "t": {}, "p10": {}} for f, (nb, _, _) in fmts.items()}
    for (f, rows), s in samples.items():
        results[f]["t"][rows] = statistics.median(s) / 1e3
        results[f]["p10"][rows] = statistics.quantiles(s, n=10)[0] / 1e3
    return results


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--max-rows", type=int, default=9)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, load average {os.getloadavg()[0]:.1f}; cells are "
          f"median (10th percentile: the machine's speed when other users leave it alone); "
          f"times in us, ratio = t(rows) / t(1)\n")
    per_token: dict[str, dict[int, float]] = {}  # format -> rows -> us, from medians
    p10_token: dict[str, dict[int, float]] = {}  # the same from 10th percentiles
    for name in args.shapes.split(","):
        k, n, uses = SHAPES[name]
        res = bench_shape(k, n, args.rounds, args.max_rows)
        rows = range(2, args.max_rows + 1)
        print(f"### {name}: {k} -> {n}\n")
        print("| format | MB | t(1) us | GB/s | " + " | ".join(f"{r}/1" for r in rows) + " |")
        print("|---|---:|---:|---:|" + "---:|" * len(rows))
        for f, d in res.items():
            t, p = d["t"], d["p10"]
            print(f"| {f} | {d['bytes'] / 1e6:.1f} | {t[1]:.0f} ({p[1]:.0f}) | {d['bytes'] / t[1] / 1e3:.1f} "
                  f"({d['bytes'] / p[1] / 1e3:.1f}) | "
                  + " | ".join(f"{t[r] / t[1]:.2f} ({p[r] / p[1]:.2f})" for r in rows) + " |")
            for r in t:
                per_token.setdefault(f, {}).setdefault(r, 0.0)
                per_token[f][r] += uses * t[r]
                p10_token.setdefault(f, {}).setdefault(r, 0.0)
                p10_token[f][r] += uses * p[r]
        print(flush=True)
    if set(args.shapes.split(",")) >= {"qkv", "q_o", "gate_up", "down", "lm_head"}:
        print("### all linears of one Qwen2.5-1.5B forward (28 x (qkv + o + gate_up + down) + lm_head), ms\n")
        print("| format | " + " | ".join(f"{r} rows" for r in range(1, args.max_rows + 1)) + " |")
        print("|---|" + "---:|" * args.max_rows)
        for f, t in per_token.items():
            print(f"| {f} | " + " | ".join(f"{t[r] / 1e3:.1f} ({p10_token[f][r] / 1e3:.1f})"
                                         for r in range(1, args.max_rows + 1)) + " |")


if __name__ == "__main__":
    main()
