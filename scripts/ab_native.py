"""The 1.5B's whole forwards on two builds of the native library in one process, in turns: the package's
sources (B) and another revision's specdecode/kernels/ (A), so that the machine's drift (this host's
memory bandwidth swings by a third within minutes) hits both alike. Each round runs a forward of every
token count on A and on B, in ABBA order; prints the medians and the paired ratios B / A, after checking
that both builds give the same logits.

    python scripts/ab_native.py --rev c433832 --tokens 1,5,9 --rounds 31
    python scripts/ab_native.py --rev HEAD --context 1000   # the same sources twice: the noise floor
    SPECDECODE_NATIVE_FLAGS=-mno-avx512f python scripts/ab_native.py --rev c433832   # the AVX2 body

A's library is swapped in under the model (``NativeKernels.lib``), so both builds must share the
operand structs of kernels/layer.py."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_at(rev: str):
    """The native library built from ``rev``'s kernels/ sources (cached like the package's own build)."""
    from specdecode import kernels

    tmp = Path(tempfile.mkdtemp(prefix="ab_native_"))
    files = kernels._SOURCES + kernels._HEADERS
    for f in files:
        got = subprocess.run(["git", "show", f"{rev}:specdecode/kernels/{f.name}"], cwd=ROOT, capture_output=True,
                             text=True)
        (tmp / f.name).write_text(got.stdout)  # empty where rev lacks the file (a header its sources do not use)
    saved = kernels._SOURCES, kernels._HEADERS
    kernels._SOURCES = tuple(tmp / f.name for f in saved[0])
    kernels._HEADERS = tuple(tmp / f.name for f in saved[1])
    try:
        return kernels.load_native_kernels(tuple(os.environ.get("SPECDECODE_NATIVE_FLAGS", "").split()))
    finally:
        kernels._SOURCES, kernels._HEADERS = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", required=True, help="the revision whose kernels are A")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--context", type=int, default=256, help="tokens in the cache before the new ones")
    ap.add_argument("--tokens", default="1,5,9", help="new tokens per forward (a verify of t - 1 drafts)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine
    from specdecode.kernels import native_kernels

    tokens = [int(t) for t in a.tokens.split(",")]
    eng = Engine(EngineConfig(model=a.model, quant="auto", threads=a.threads,
                              max_model_len=max(1024, a.context + max(tokens) + 64)))
    nk = native_kernels()
    libs = {"A": build_at(a.rev).lib, "B": nk.lib}
    runner, kv = eng.runner, eng.kv
    prompt = torch.randint(0, 100000, (a.context,), generator=torch.Generator().manual_seed(0)).tolist()
    slot = kv.allocate()
    runner.forward([slot], [prompt], last_only=True)

    def forward(name: str, t: int) -> tuple[float, torch.Tensor]:
        object.__setattr__(nk, "lib", libs[name])  # the frozen handle every native call goes through
        kv.set_length(slot, len(prompt))
        t0 = time.perf_counter()
        logits = runner.forward([slot], [prompt[:t]], row_exact=True)[0]
        return time.perf_counter() - t0, logits

    try:
        for t in tokens:
            if not torch.equal(forward("A", t)[1], forward("B", t)[1]):
                print(f"t={t}: the two builds give different logits")
                return 1
        times = {(n, t): [] for n in libs for t in tokens}
        for r in range(a.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                for t in tokens:
                    times[(name, t)].append(forward(name, t)[0])
    finally:
        object.__setattr__(nk, "lib", libs["B"])
    for t in tokens:
        ta, tb = times[("A", t)][2:], times[("B", t)][2:]
        ratios = sorted(y / x for x, y in zip(ta, tb))
        q = len(ratios) // 4
        print(f"t={t}: A {statistics.median(ta) * 1e3:.2f} ms, B {statistics.median(tb) * 1e3:.2f} ms, "
              f"B/A paired median {statistics.median(ratios):.3f} (quartiles {ratios[q]:.3f}-{ratios[-1 - q]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
