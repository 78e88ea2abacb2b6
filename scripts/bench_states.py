"""The host's memory bandwidth and the 1.5B's one-token forward, side by side over time: every interval
reads a 1 GiB buffer in 2 MiB pages on one thread and on all of them (scripts/stream_read.c, as
bench_runtime.py's probe), then times ten forwards after a 256-token context, and prints the forward's
weight stream against the probe. On a VM whose bandwidth switches between states within minutes, this
shows each state's figures apart (docs/benchmarks.md, round 35); --gemms also times the decoder's int4
GEMMs alone (called from Python, one call per matrix).

    python scripts/bench_states.py --seconds 60
    python scripts/bench_states.py --seconds 45 --gemms
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import bandwidth, huge_page_tensor, stream_reader, weight_bytes_per_token  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--gemms", action="store_true", help="also time the decoder's int4 GEMMs alone")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine
    from specdecode.kernels import native_kernels

    eng = Engine(EngineConfig(model=a.model, quant="auto", threads=a.threads, max_model_len=1024))
    runner, kv = eng.runner, eng.kv
    wbytes = weight_bytes_per_token(eng.model)
    linears = [m for layer in eng.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                           layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    if a.gemms and not all(hasattr(m, "qsuper") for m in linears):
        sys.exit("--gemms needs the decoder's linears on the native int4 kernel")
    gbytes = sum(t.numel() * t.element_size() for m in linears for t in (m.qweight, m.qparams, m.qsuper)) if a.gemms else 0
    nk = native_kernels()
    xs = {k: torch.randn(1, k) for k in {m.in_features for m in linears}}
    prompt = torch.randint(0, 100000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    slot = kv.allocate()
    runner.forward([slot], [prompt], last_only=True)
    buf, share = huge_page_tensor(2**30)
    read = stream_reader()
    if read is None:
        sys.exit("bench_states: scripts/stream_read.c could not be built (a C compiler and AVX2 are needed)")
    print(f"weights per token {wbytes / 1e6:.0f} MB; probe buffer {share:.0%} in huge pages")
    start = time.time()
    while time.time() - start < a.seconds:
        one = bandwidth(lambda x: read(x, 1), buf, reps=3)
        team = bandwidth(lambda x: read(x, a.threads), buf, reps=3)
        fw, gm = [], []
        for _ in range(10):
            kv.set_length(slot, len(prompt))
            t0 = time.perf_counter()
            runner.forward([slot], [prompt[:1]], last_only=True)
            fw.append(time.perf_counter() - t0)
            if a.gemms:
                t0 = time.perf_counter()
                for m in linears:
                    nk.int4_gemm(xs[m.in_features], m.qweight, m.qparams, m.qsuper, m.out_features, m.group_size)
                gm.append(time.perf_counter() - t0)
        f = statistics.median(fw)
        line = (f"{time.time() - start:5.1f} s  probe 1 thread {one / 1e9:5.1f} GB/s, {a.threads} {team / 1e9:5.1f}; "
                f"forward {f * 1e3:5.1f} ms = {wbytes / f / 1e9:5.1f} GB/s ({wbytes / f / team:.2f} of the probe)")
        if a.gemms:
            g = statistics.median(gm)
            line += f"; GEMMs {g * 1e3:5.1f} ms = {gbytes / g / 1e9:5.1f} GB/s ({gbytes / g / team:.2f})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
