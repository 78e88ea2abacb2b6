"""The native attention kernel (kernels/attention.c) alone, at the 1.5B's shapes: one verify-sized call
per layer over 28 distinct bfloat16 caches (so that a layer's keys come from beyond L2, as in a
forward), and prefill chunks. Prints milliseconds per 28 layers, medians of --reps.

With two files, builds both in turns (ABBA) and checks first that they give the same bits:

    git show 6178a08:specdecode/kernels/attention.c > /tmp/attn_before.c
    python scripts/bench_attention.py /tmp/attn_before.c specdecode/kernels/attention.c
"""
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
from specdecode.kernels import _FLAGS, NativeKernels  # noqa: E402

LAYERS, H, HKV, D = 28, 12, 2, 128


def build(source: str, out: Path) -> NativeKernels:
    kdir = Path(__file__).resolve().parents[1] / "specdecode" / "kernels"
    subprocess.run(["gcc", *_FLAGS, f"-I{kdir}", source, "-o", str(out), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.specdecode_attention.argtypes = [p, p, p, i, i, i, i, i, i, i, p, p, p, i, ctypes.c_float, p, i]
    lib.specdecode_attention.restype = i
    return NativeKernels(lib, "", out.name)


def cases(context: int):
    """(name, q [1, H, T, D], nkeys [1, T]): verifies of 1, 5, 9 tokens after ``context``, prefill chunks
    (from the start, and after 256 tokens, or after ``context`` where that is longer)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for T, start in ((1, context), (5, context), (9, context), (256, 0), (512, max(256, context))):
        nkeys = (torch.arange(T) + start + 1).to(torch.int32)[None].contiguous()
        out.append((f"T={T} at {start}", torch.randn(1, H, T, D, generator=g), nkeys))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sources", nargs="*", help="attention.c files (none: the package's build)")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--context", type=int, default=256, help="tokens before the verifies (keys they attend)")
    a = ap.parse_args()
    lmax = max(1024, a.context + 512 + 64)  # the cache's rows per slot: room for every case
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(1)
    kcs = [torch.randn(1, HKV, lmax, D, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    vcs = [torch.randn(1, HKV, lmax, D, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    slots = torch.zeros(1, dtype=torch.int32)
    with tempfile.TemporaryDirectory() as tmp:
        if a.sources:
            kernels = [build(s, Path(tmp) / f"k{i}.so") for i, s in enumerate(a.sources)]
        else:
            from specdecode.kernels import native_kernels
            kernels = [native_kernels()]
        for name, q, nkeys in cases(a.context):
            layers = LAYERS if q.shape[2] <= 16 else 1  # a prefill chunk: one layer is enough
            outs = [k.attention(q, kcs[0], vcs[0], slots, nkeys, None) for k in kernels]
            if any(not torch.equal(outs[0], o) for o in outs[1:]):
                print(f"{name}: outputs differ")
                return 1
            times = [[] for _ in kernels]
            for r in range(a.reps):
                order = range(len(kernels)) if r % 2 == 0 else reversed(range(len(kernels)))
                for i in order:
                    t0 = time.perf_counter()
                    for layer in range(layers):
                        kernels[i].attention(q, kcs[layer], vcs[layer], slots, nkeys, None)
                    times[i].append(time.perf_counter() - t0)
            med = [statistics.median(t) * 1e3 for t in times]
            unit = "ms per 28 layers" if layers == LAYERS else "ms per layer"
            line = " -> ".join(f"{m:.3f}" for m in med)
            print(f"{name}: {line} {unit}" + (f" ({med[-1] / med[0]:.2f})" if len(med) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
