"""Two builds of the int4/int8 kernels (quant_gemm.c) against each other in one process, called in turns,
in ABBA order, so that a drift of the machine's speed hits both alike; outputs are compared bit for bit
first. The same file given twice measures the noise floor (the two builds differ only in where they load).

    git show 59032e4:specdecode/kernels/quant_gemm.c > /tmp/quant_gemm_before.c
    python scripts/ab_kernels.py /tmp/quant_gemm_before.c specdecode/kernels/quant_gemm.c --flags=-mno-avx512f --threads 1
    python scripts/ab_kernels.py /tmp/quant_gemm_before.c specdecode/kernels/quant_gemm.c --flags=-mno-avx512f --stream

Default (cache-hot): one 1536 x 1536 int4 matrix (1.2 MB) and a 1024 x 1536 int8 one, medians of 9
batches of 1000 calls per row count. ``--stream``: the 1.5B's 112 int4 decoder matrices (Qwen2.5-1.5B
shapes, random codes) and its int8 LM head streamed from DRAM as a decode step streams them, medians of
8 passes (``--passes``), in 4 KiB pages or, with ``--huge-pages``, in 2 MiB pages as the engine's weights
are where the host gives them (runtime/host_memory.py). ``--flags``: extra compiler flags for both builds
(``-mno-avx512f``: the AVX2 body). A variant of one of quant_gemm.c's bodies (quant_gemm_*.h) is a copy of the
whole kernels folder, edited, whose quant_gemm.c is given here: its quoted includes resolve beside it first."""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_kernels import QWEN15_SHAPES  # noqa: E402  (scripts/ is sys.path[0])
from specdecode.kernels import _FLAGS, NativeKernels, int4_scale_buffers  # noqa: E402
from specdecode.layers.quant.formats import super_groups  # noqa: E402


def build(source: str, flags: list[str], out: Path) -> NativeKernels:
    """quant_gemm.c alone, with the package's flags: only the GEMM entry points are bound."""
    include = Path(__file__).resolve().parents[1] / "specdecode" / "kernels"  # its headers, for a variant kept elsewhere
    subprocess.run(["gcc", *_FLAGS, *flags, f"-I{include}", source, "-o", str(out), "-lm"], check=True,
                   capture_output=True)
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.specdecode_int4_gemm.argtypes = [p, i, i, i, i, p, p, p, p, p, p, p, i]
    lib.specdecode_int8_gemm.argtypes = [p, i, i, i, p, p, p, p, p, p, p, p, i]
    lib.specdecode_isa.restype = ctypes.c_char_p
    return NativeKernels(lib, lib.specdecode_isa().decode(), out.name)


def int4_matrix(n: int, k: int) -> tuple[int, int, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    g = k // 32
    sub, sup = int4_scale_buffers(n, g, g // super_groups(g))
    sub.random_(0, 256)  # sub-scales and minima: any bytes
    sup.random_(0, 0x3000)  # super-scales: half bits of moderate positive values
    return n, k, torch.randint(0, 256, (n, k // 2), dtype=torch.uint8), (sub, sup)


def in_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in an arena of 2 MiB pages, kept however slowly they fault in."""
    from specdecode.runtime.host_memory import Arena
    out = Arena(t.numel() * t.element_size(), limit=float("inf")).empty(tuple(t.shape), t.dtype)
    out.copy_(t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs=2, help="two quant_gemm.c files: before, after")
    ap.add_argument("--flags", default="", help="extra compiler flags for both builds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--stream", action="store_true", help="a whole model's matrices from DRAM instead of one hot matrix")
    ap.add_argument("--huge-pages", action="store_true", help="--stream's matrices in 2 MiB pages (module doc)")
    ap.add_argument("--passes", type=int, help="passes per build and row count (default: 8 streamed, 9 cache-hot)")
    ap.add_argument("--int4-only", action="store_true", help="leave the int8 matrix out")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the bit-for-bit check: for timing-only variants (a step removed to see its cost)")
    ap.add_argument("--rows", help="comma-separated activation row counts (default: 1,5,9 streamed, 1,2,3,5,9 cache-hot)")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp())
    libs = [build(s, a.flags.split(), tmp / f"k{i}.so") for i, s in enumerate(a.sources)]
    print(f"isa {libs[0].isa}, {a.threads} threads, {'streamed from DRAM' if a.stream else 'cache-hot'}")
    if a.stream:
        mats = [int4_matrix(n, k) for n, k in QWEN15_SHAPES]
        head, hscale, hn, rows, passes, calls = torch.randint(0, 256, (151936, 1536), dtype=torch.uint8), \
            torch.rand(151936), 151936, (1, 5, 9), 8, 1
    else:
        mats = [int4_matrix(1536, 1536)]
        head, hscale, hn, rows, passes, calls = torch.randint(0, 256, (1024, 1536), dtype=torch.uint8), \
            torch.rand(1024), 1024, (1, 2, 3, 5, 9), 9, 1000
    if a.rows:
        rows = tuple(int(x) for x in a.rows.split(","))
    passes = a.passes or passes
    if a.huge_pages:
        mats = [(n, k, in_huge_pages(p), s) for n, k, p, s in mats]
        head = in_huge_pages(head)
    for r in rows:
        xs = {k: torch.randn(r, k) for k in {k for _, k, _, _ in mats}}

        def run(lib):
            ys = [lib.int4_gemm(xs[k], p, *s, n, 32) for n, k, p, s in mats]
            return ys if a.int4_only else ys + [lib.int8_gemm(xs[1536], head, hscale, hn)]
        if not a.no_check and not all(torch.equal(u, v) for u, v in zip(run(libs[0]), run(libs[1]))):
            sys.exit(f"the two builds' outputs differ ({r} rows)")
        times = [[] for _ in libs]
        for i in range(passes):  # ABBA order: neither build always runs first
            for lib, t in (zip(libs, times) if i % 2 == 0 else reversed(list(zip(libs, times)))):
                t0 = time.perf_counter()
                for _ in range(calls):
                    run(lib)
                t.append((time.perf_counter() - t0) / calls)
        a_ms, b_ms = (statistics.median(t) * 1e3 for t in times)
        a_min, b_min = (min(t) * 1e3 for t in times)
        pairs = statistics.median(y / x for x, y in zip(*times))  # each pass's B against the A beside it
        unit, scale = ("ms", 1) if a.stream else ("us", 1000)
        print(f"{r} rows: {a_ms * scale:.1f} {unit} -> {b_ms * scale:.1f} {unit} ({b_ms / a_ms:.2f}); "
              f"fastest {a_min * scale:.1f} -> {b_min * scale:.1f} ({b_min / a_min:.2f}); paired {pairs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
