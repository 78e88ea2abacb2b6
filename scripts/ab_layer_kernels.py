"""The layers' small native kernels (SwiGLU's silu_mul, attention) of this checkout against another
revision's build, in one process and in turns (ABBA), outputs compared bit for bit first. Each line: the
median ratio of this build's time to the other's over the rounds (below 1 = faster), its range, and the
other build's time per call. Whole steps: bench_interleaved.py's native-rev variant; the GEMMs:
ab_kernels.py.

    python scripts/ab_layer_kernels.py --rev HEAD~1
    SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/ab_layer_kernels.py --rev HEAD~1   # the AVX2 body
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ab_native import build_at  # noqa: E402  (scripts/ is sys.path[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the revision whose kernels/ sources the other build takes")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100, help="calls per timing")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.kernels import native_kernels

    new, old = native_kernels(), build_at(a.rev)

    def ab(label: str, fn) -> None:
        ratios, t = [], {}
        for r in range(a.rounds):
            for name, k in (("old", old), ("new", new)) if r % 2 else (("new", new), ("old", old)):
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    fn(k)
                t[name] = (time.perf_counter() - t0) / a.calls
            ratios.append(t["new"] / t["old"])
        print(f"{label}: this / {a.rev} {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), "
              f"{a.rev} {1e6 * t['old']:.1f} us a call", flush=True)

    g = torch.Generator().manual_seed(0)
    for rows in (1, 5, 8):  # the 1.5B's SwiGLU width
        gu = torch.randn(rows, 2 * 8960, generator=g) * 4
        if not torch.equal(new.silu_mul(gu), old.silu_mul(gu)):
            sys.exit("ab_layer_kernels: silu_mul's outputs differ")
        ab(f"silu_mul, {rows} rows x 8960", lambda k: k.silu_mul(gu))
    heads, kv_heads, dim = 12, 2, 128  # the 1.5B's attention, bf16 cache
    for batch, tokens, keys in ((1, 1, 300), (1, 1, 1000), (8, 1, 300), (1, 5, 1000)):
        kc = torch.randn(batch, kv_heads, keys + tokens, dim, generator=g).to(torch.bfloat16)
        vc = torch.randn(batch, kv_heads, keys + tokens, dim, generator=g).to(torch.bfloat16)
        q = torch.randn(batch, heads, tokens, dim, generator=g)
        slots = torch.arange(batch, dtype=torch.int32)
        nkeys = (torch.full((batch, 1), keys) + torch.arange(tokens)).to(torch.int32)
        args = (q, kc, vc, slots, nkeys, None)
        if not torch.equal(new.attention(*args), old.attention(*args)):
            sys.exit("ab_layer_kernels: attention's outputs differ")
        ab(f"attention, batch {batch} x {tokens} new over {keys} keys", lambda k: k.attention(*args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
