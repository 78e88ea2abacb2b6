"""Weights in 4 KiB pages (A) against weights in transparent huge pages (B), in one process, in turns
(runtime/host_memory.py). Huge pages are forced for B (the fault-in's fallback off), so that a host
where they fault in slowly still measures what they give once in place.

Default: two engines of the 1.5B, whole forwards of 1, 5 and 9 tokens after a 256-token context, ABBA
rounds; prints each engine's construction time and huge pages, the medians and the paired ratios B / A.
``--mapped``: B maps its weights from the weight cache's entry instead (loader/weight_cache.py: the page
cache's 2 MiB folios mapped as huge pages), as a default engine does; A converts into ordinary pages.
``--stream``: the int4 kernel alone streaming 28 gate/up-sized matrices (17920 x 1536, random codes, ~0.44
GB) from each kind of memory, one row, as a decode step streams its weights.

    python scripts/ab_hugepages.py --rounds 41
    python scripts/ab_hugepages.py --stream --rounds 30
    python scripts/ab_hugepages.py --mapped --rounds 41; python scripts/ab_hugepages.py --mapped --rounds 41 --b-first
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdecode.runtime import host_memory  # noqa: E402


def huge_mb() -> int:
    return int(Path("/proc/self/smaps_rollup").read_text().split("AnonHugePages:")[1].split()[0]) // 1024


def paired(name: str, ta: list[float], tb: list[float]) -> str:
    ratios = sorted(b / a for a, b in zip(ta, tb))
    q = len(ratios) // 4
    return (f"{name}: A {statistics.median(ta) * 1e3:.2f} ms, B {statistics.median(tb) * 1e3:.2f} ms, "
            f"B/A paired median {statistics.median(ratios):.3f} (quartiles {ratios[q]:.3f}-{ratios[-1 - q]:.3f})")


def in_turns(rounds: int, run) -> dict[str, list[float]]:
    times = {"A": [], "B": []}
    for r in range(rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            times[name].append(run(name))
    return {k: v[2:] for k, v in times.items()}


def stream(rounds: int) -> None:
    from specdecode.kernels import native_kernels

    nk = native_kernels()
    K, N, gs, layers = 1536, 17920, 32, 28
    sets = {}
    for name, huge in (("A", False), ("B", True)):
        host_memory.ENABLED = huge
        mats = []
        for _ in range(layers):
            layer = torch.nn.Module()
            layer.register_buffer("p", torch.empty(N // 16, K // gs, gs // 8, 64, dtype=torch.uint8, device="meta"))
            layer.register_buffer("s", torch.empty(N // 16, K // gs, 2, 16, dtype=torch.uint8, device="meta"))
            layer.register_buffer("u", torch.empty(N // 16, K // (gs * 8), 2, 16, dtype=torch.int16, device="meta"))
            mats.append(layer)
        holder = host_memory.allocate(torch.nn.ModuleList(mats), "cpu")
        for m in holder:
            m.p.random_(0, 256)
            m.s.random_(0, 64)
            m.u.fill_(0x3C00)  # half 1.0
        sets[name] = holder
    print("huge pages:", huge_mb(), "MB")
    x = torch.randn(1, K)

    def run(name: str) -> float:
        t0 = time.perf_counter()
        for m in sets[name]:
            nk.int4_gemm(x, m.p, m.s, m.u, N, gs)
        return time.perf_counter() - t0

    t = in_turns(rounds, run)
    print(paired("28 x [17920, 1536] int4, one row", t["A"], t["B"]))


def forwards(rounds: int, mapped: bool, b_first: bool) -> None:
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine

    engines = {}
    for name, huge in (("B", True), ("A", False)) if b_first else (("A", False), ("B", True)):
        host_memory.ENABLED = huge and not mapped
        before, t0 = huge_mb(), time.perf_counter()
        eng = Engine(EngineConfig(model="qwen2.5-coder-1.5b-instruct", quant="auto", threads=2, max_model_len=1024,
                                  weight_cache=huge if mapped else False))
        print(f"{name}: construction {time.perf_counter() - t0:.2f} s, huge pages +{huge_mb() - before} MB", flush=True)
        prompt = torch.randint(0, 100000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
        slot = eng.kv.allocate()
        eng.runner.forward([slot], [prompt], last_only=True)
        engines[name] = (eng, slot, prompt)
    for t in (1, 5, 9):
        def run(name: str) -> float:
            eng, slot, prompt = engines[name]
            eng.kv.set_length(slot, len(prompt))
            t0 = time.perf_counter()
            eng.runner.forward([slot], [prompt[:t]], row_exact=True)
            return time.perf_counter() - t0

        times = in_turns(rounds, run)
        print(paired(f"t={t}", times["A"], times["B"]), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--stream", action="store_true", help="the int4 kernel alone over synthetic weights")
    ap.add_argument("--mapped", action="store_true", help="B maps its weights from the weight cache")
    ap.add_argument("--b-first", action="store_true", help="construct B before A (the second engine's memory "
                    "has streamed up to a few percent faster on this host: run both orders)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    host_memory.CHUNK_LIMIT = float("inf")  # B keeps its huge pages however slowly they fault in
    stream(a.rounds) if a.stream else forwards(a.rounds, a.mapped, a.b_first)
    return 0


if __name__ == "__main__":
    sys.exit(main())
