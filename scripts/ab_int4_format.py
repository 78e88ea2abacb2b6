"""The int4 kernel before and after its scale format changed (per 32 weights: an fp16 scale and zero,
5.0 bits per weight; then 8-bit sub-scales under fp16 super-scales per 256, 4.625), streamed from DRAM
over the 1.5B's 112 decoder matrices (random codes), in ABBA order in one process. The two builds take
different scale buffers, so their outputs are not compared (tests/test_int4_kernel.py checks each).

    git show 36b9f1a:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_5bit.c
    python scripts/ab_int4_format.py /tmp/quant_gemm_5bit.c specdecode/kernels/quant_gemm.c [--flags=-mno-avx512f]"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_kernels import build, int4_matrix  # noqa: E402  (scripts/ is sys.path[0])
from bench_kernels import QWEN15_SHAPES  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="quant_gemm.c with half scale and zero per group")
    ap.add_argument("new", help="quant_gemm.c with sub-scales and super-scales")
    ap.add_argument("--flags", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,5,9")
    ap.add_argument("--passes", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp())
    old, new = build(a.old, a.flags.split(), tmp / "old.so"), build(a.new, a.flags.split(), tmp / "new.so")
    mats = []
    for n, k in QWEN15_SHAPES:
        _, _, codes, (sub, sup) = int4_matrix(n, k)
        mats.append((n, k, codes, torch.full((2, n // 16, k // 32, 16), 0x2000, dtype=torch.int16), sub, sup))
    mb_old = sum(p.numel() + 2 * s.numel() for _, _, p, s, _, _ in mats) / 1e6
    mb_new = sum(p.numel() + sb.numel() + 2 * sp.numel() for _, _, p, _, sb, sp in mats) / 1e6
    print(f"isa {old.isa}, {a.threads} threads; bytes per pass {mb_old:.0f} MB -> {mb_new:.0f} MB")
    for r in (int(x) for x in a.rows.split(",")):
        xs = {k: torch.randn(r, k) for k in {k for _, k, *_ in mats}}
        runs = [lambda: [old.int4_gemm(xs[k], p, s[0], s[1], n, 32) for n, k, p, s, _, _ in mats],
                lambda: [new.int4_gemm(xs[k], p, sb, sp, n, 32) for n, k, p, _, sb, sp in mats]]
        for f in runs:
            f()
        times = [[], []]
        for i in range(a.passes):
            for j in ((0, 1) if i % 2 == 0 else (1, 0)):
                t0 = time.perf_counter()
                runs[j]()
                times[j].append(time.perf_counter() - t0)
        o, n_ = (statistics.median(t) * 1e3 for t in times)
        print(f"{r} rows: {o:.1f} ms -> {n_:.1f} ms ({n_ / o:.3f}); GB/s {mb_old / o:.1f} -> {mb_new / n_:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
