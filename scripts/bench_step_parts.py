"""Where a plain decode step's time goes, and what the weights' streaming does to the Python around it.

Part 1 (the step): greedy plain decoding of one request, timed per step and split into the native
decoder layers (one call per step), the LM head's native GEMM and the rest (Python: the runner, the
embedding, the final norm, accept, commit, the engine's bookkeeping), each against a 1 GiB float32
sum (the bandwidth probe of bench_runtime.py) taken right before each repetition.

Part 2 (cold caches): one small operation (the final RMSNorm on one row; torch.empty_like of it)
timed warm, and right after a 256 MiB float32 sum has streamed through every cache level, as a decode
step's ~0.9 GB of weights do before the step's Python runs.

    python scripts/bench_step_parts.py --reps 3
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def probe(x: torch.Tensor) -> float:
    """Bytes per second of x.sum() (one warm-up)."""
    x.sum()
    t0 = time.perf_counter()
    x.sum()
    return x.numel() * x.element_size() / (time.perf_counter() - t0)


def median_us(fn, before=None, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from bench_batch_drafters import timed
    from specdecode import LLM, SamplingParams
    from specdecode.kernels import NativeKernels

    llm = LLM(a.model, spec_type="none", threads=a.threads, max_num_seqs=1)
    eng = llm.engine
    parts = collections.Counter()
    timed(NativeKernels, "decoder_layers", "layers", parts)
    timed(NativeKernels, "int4_gemm", "head", parts)  # the only int4 GEMM outside the fused layers
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    big = torch.ones(256 << 20)  # 1 GiB
    rows = []
    for rep in range(a.reps):
        bw = probe(big)
        eng.reset_prefix_cache()
        seq = eng.add_request(list(range(1000, 1100)), params)
        eng.step()  # the prompt
        parts.clear()
        n, t0 = 0, time.perf_counter()
        while not seq.finished:
            eng.step()
            n += 1
        step = (time.perf_counter() - t0) / n
        layers, head = parts["layers"] / n, parts["head"] / n
        rows.append((step, layers, head, step - layers - head, bw))
        print(f"rep {rep}: step {step * 1e3:.2f} ms = layers {layers * 1e3:.2f} + LM head {head * 1e3:.2f} + "
              f"rest {(step - layers - head) * 1e3:.2f} ms; probe {bw / 1e9:.1f} GB/s", flush=True)
    med = [statistics.median(r[i] for r in rows) for i in range(5)]
    print(f"median: step {med[0] * 1e3:.2f} ms, layers {med[1] * 1e3:.2f}, LM head {med[2] * 1e3:.2f}, "
          f"rest {med[3] * 1e3:.2f} ms ({med[3] / med[0]:.1%} of the step)")

    norm = eng.runner.model.norm
    x = torch.randn(1, 1, norm.weight.shape[0])
    stream = big[:64 << 20]  # 256 MiB
    with torch.inference_mode():
        for label, fn in (("final RMSNorm, one row", lambda: norm(x)),
                          ("torch.empty_like, one row", lambda: torch.empty_like(x))):
            warm = median_us(fn)
            cold = median_us(fn, before=stream.sum)
            print(f"{label}: warm {warm:.1f} us, after a 256 MiB stream {cold:.1f} us ({cold / warm:.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
