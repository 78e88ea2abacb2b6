"""Is the int4 GEMM bound by memory or by compute at a given row count? The 1.5B's 112 decoder
matrices (random codes, in 2 MiB pages) called in the model's order, layer after layer, as a forward
streams them from DRAM, against the same calls on one copy of each shape (27 MB, which stays in the
caches: the compute alone). Where the streamed time is close to the cached one, the extra rows of a
verify or a batch cost compute, and only fewer operations per row can make them cheaper; where it is
well above, the pass waits on memory. Rounds interleave the two modes and the row counts; prints per
shape and in all the median time, the bytes per second and streamed / cached.

    python scripts/bench_gemm_bound.py --rows 1,5,9
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_kernels import in_huge_pages, int4_matrix  # noqa: E402  (scripts/ is sys.path[0])
from specdecode.kernels import native_kernels  # noqa: E402

SHAPES = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}  # Qwen2.5-1.5B
LAYERS = 28


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,5,9", help="comma-separated activation row counts")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per mode and row count (the first is dropped)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)  # the kernels take torch's thread count
    lib = native_kernels()  # SPECDECODE_NATIVE_FLAGS=-mno-avx512f: the AVX2 body
    layers = [{name: int4_matrix(n, k) for name, (n, k) in SHAPES.items()} for _ in range(LAYERS)]
    layers = [{name: (n, k, in_huge_pages(p), tuple(in_huge_pages(t) for t in s))
               for name, (n, k, p, s) in layer.items()} for layer in layers]
    nbytes = {name: sum(t.numel() * t.element_size() for t in (p, *s)) for name, (_, _, p, s) in layers[0].items()}
    rows = [int(r) for r in a.rows.split(",")]
    times = {(r, mode, name): [] for r in rows for mode in ("streamed", "cached") for name in SHAPES}
    print(f"isa {lib.isa}, {a.threads} threads, {sum(nbytes.values()) * LAYERS / 1e6:.0f} MB streamed per pass")
    for _ in range(a.rounds):
        for r in rows:
            xs = {k: torch.randn(r, k) for k in {k for _, k in SHAPES.values()}}
            for mode in ("streamed", "cached"):
                spent = dict.fromkeys(SHAPES, 0.0)
                for i in range(LAYERS):
                    for name, (n, k, p, s) in layers[i if mode == "streamed" else 0].items():
                        t0 = time.perf_counter()
                        lib.int4_gemm(xs[k], p, *s, n, 32)
                        spent[name] += time.perf_counter() - t0
                for name, t in spent.items():
                    times[(r, mode, name)].append(t)
    for r in rows:
        print(f"{r} row{'s' if r > 1 else ''}:")
        for name in [*SHAPES, "all"]:
            med = {}
            for mode in ("streamed", "cached"):
                if name == "all":
                    per_round = [sum(v) for v in zip(*(times[(r, mode, s)][1:] for s in SHAPES))]
                else:
                    per_round = times[(r, mode, name)][1:]
                med[mode] = statistics.median(per_round)
            b = LAYERS * (sum(nbytes.values()) if name == "all" else nbytes[name])
            print(f"  {name:8s} streamed {med['streamed'] * 1e3:7.2f} ms ({b / med['streamed'] / 1e9:5.1f} GB/s)  "
                  f"cached {med['cached'] * 1e3:7.2f} ms ({b / med['cached'] / 1e9:5.1f} GB/s)  "
                  f"streamed / cached {med['streamed'] / med['cached']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
