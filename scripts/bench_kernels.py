"""The native kernels on a whole model's worth of matrices, streamed from DRAM as decode streams them:
the 1.5B's 112 int4 decoder matrices (Qwen2.5-1.5B shapes, random codes) and its int8 LM head, for
R = 1, 5, 9 activation rows, against a plain 1 GiB float32 sum in the same process.

    python scripts/bench_kernels.py --threads 2
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdecode.kernels import int4_scale_buffers, native_kernels
from specdecode.layers.quant.formats import super_groups


# The 1.5B's decoder matrices as (out, in): qkv, o, gate_up, down of each of its 28 layers.
QWEN15_SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)] * 28


def median_time(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,5,9", help="comma-separated activation row counts")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    k = native_kernels()
    if k is None:
        raise SystemExit("native kernels not available on this machine")
    mats = []
    for n, kk in QWEN15_SHAPES:
        sub, sup = int4_scale_buffers(n, kk // 32, kk // 32 // super_groups(kk // 32))
        sup.fill_(0x2000)
        mats.append((n, kk, torch.randint(0, 256, (n, kk // 2), dtype=torch.uint8), (sub, sup)))
    int4_bytes = sum(p.numel() + s[0].numel() + 2 * s[1].numel() for _, _, p, s in mats)
    head, head_scale = torch.randint(0, 256, (151936, 1536), dtype=torch.uint8), torch.ones(151936)
    print(f"isa {k.isa}, int4 matrices {int4_bytes / 1e6:.0f} MB, int8 head {head.numel() / 1e6:.0f} MB")
    for r in (int(x) for x in a.rows.split(",")):
        xs = {kk: torch.randn(r, kk) for kk in (1536, 8960)}
        t4 = median_time(lambda: [k.int4_gemm(xs[kk], p, *s, n, 32) for n, kk, p, s in mats])
        t8 = median_time(lambda: k.int8_gemm(xs[1536], head, head_scale, 151936))
        print(f"R={r}: int4 {t4 * 1e3:.1f} ms = {int4_bytes / t4 / 1e9:.1f} GB/s | "
              f"int8 head {t8 * 1e3:.1f} ms = {head.numel() / t8 / 1e9:.1f} GB/s")
    x = torch.ones(256 * 2**20)
    print(f"1 GiB float32 sum: {x.numel() * 4 / median_time(x.sum) / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
