"""Single-stream runtime figures for docs/benchmarks.md: prefill and decode tok/s, the decode
ceiling (weight bytes read per token / measured memory bandwidth), and the verify cost curve
v(t)/v(1) for t = 1..9 new tokens.

    python scripts/bench_runtime.py --model qwen2.5-coder-1.5b-instruct --quant int4 --threads 2

Every figure is a median over --reps runs in this process. Bandwidth is measured here, in the same
process and thread count, by reading 1 GiB float32 buffers (pure streaming reads on every thread),
right before each decode run: the host's bandwidth drifts by tens of percent within minutes, so each run's
fraction of the ceiling is its decode against its own probe, and the median and range of those
fractions are reported. The verify curve's ratios are likewise paired within each of 9 rounds
(median and range over the rounds).

The probe reads four ways and the ceiling is the fastest: torch's x.sum() (the probe of rounds before
35) and scripts/stream_read.c (eight 256-bit accumulators per thread, software prefetch into L1) over a
buffer in ordinary 4 KiB pages, and stream_read.c over one in transparent 2 MiB pages (an anonymous
mapping marked MADV_HUGEPAGE and faulted in before timing), once as it is and once also requesting lines
16 KiB ahead into L2, as the int4 kernel streams its weights (on Intel hosts one level alone read slower
than the kernel's decode streamed, docs/benchmarks.md, round 39). The weights sit in 2 MiB pages where the host gives them
(runtime/host_memory.py, the weight cache's mapping), so a ceiling measured in 4 KiB pages alone could
sit below what the same memory streams at in them; on a VM, which way reads fastest changes from moment
to moment (docs/benchmarks.md, round 35)."""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch


def huge_page_tensor(nbytes: int) -> tuple[torch.Tensor, float]:
    """float32 zeros of ``nbytes`` in an arena of 2 MiB pages kept however slowly they fault in
    (runtime/host_memory.py); and the share of it the kernel backs with huge pages (AnonHugePages of the
    mapping in /proc/self/smaps; 0 where transparent huge pages are off)."""
    from specdecode.runtime.host_memory import Arena

    x = Arena(nbytes, limit=float("inf")).empty((nbytes // 4,), torch.float32)
    x.zero_()
    start = x.data_ptr()
    huge, cur = 0, None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) > 4:
            lo, hi = (int(v, 16) for v in head[0].split("-"))
            cur = lo <= start < hi
        elif cur and head[0] == "AnonHugePages:":
            huge = int(head[1]) * 1024
    return x, min(1.0, huge / nbytes)  # the mapping holds a spare huge page for alignment


def stream_reader():
    """stream_read(x, threads, far=0) -> x's float sum, read by the native probe (built here with the C
    compiler; far: two prefetch levels); None where it cannot be built (no compiler, no AVX2): the probe is
    then torch's sum alone."""
    if "avx2" not in Path("/proc/cpuinfo").read_text():
        return None
    src = Path(__file__).with_name("stream_read.c")
    out = Path(tempfile.gettempdir()) / f"specdecode_stream_read_{int(src.stat().st_mtime)}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.so")
        try:
            subprocess.run(["cc", "-O2", "-mavx2", "-shared", "-fPIC", str(src), "-o", str(tmp), "-lpthread"],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        tmp.replace(out)
    lib = ctypes.CDLL(str(out))
    lib.stream_read_pf.restype = ctypes.c_float
    lib.stream_read_pf.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    return lambda x, threads, far=0: lib.stream_read_pf(x.data_ptr(), x.numel(), threads, far)


def bandwidth(read, x: torch.Tensor, reps: int = 5) -> float:
    """Bytes per second of read(x), median of reps; x: 1 GiB float32, far beyond any cache."""
    read(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        read(x)
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times)


def weight_bytes_per_token(model) -> int:
    """Bytes streamed from memory per decoded token: every linear layer's weight (with its scales),
    the LM head, the norms; the embedding contributes one row only."""
    total = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.startswith("embed_tokens"):
            if model.lm_head is None and name == "embed_tokens.weight":
                total += t.numel() * t.element_size()  # tied head reads the whole table
            continue
        total += t.numel() * t.element_size()
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--quant", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine
    from specdecode.sampling import argmax_rows  # the engine's greedy pick (a plain step's)

    eng = Engine(EngineConfig(model=a.model, quant=a.quant, threads=a.threads, max_model_len=1024))
    runner, kv = eng.runner, eng.kv
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, eng.model.cfg.vocab_size - 1000, (a.prompt_tokens,), generator=gen).tolist()
    slot = kv.allocate()
    wbytes = weight_bytes_per_token(eng.model)
    probe = torch.ones(256 * 2**20)
    native = stream_reader()
    probe_huge, huge_share = huge_page_tensor(2**30) if native else (None, 0.0)
    read = lambda x: native(x, a.threads)  # noqa: E731
    read_far = lambda x: native(x, a.threads, 1)  # noqa: E731
    prefill, decode, bws, bws_4k, bws_2m, bws_far, bws_torch = [], [], [], [], [], [], []
    for _ in range(a.reps + 1):  # the first round warms up and is dropped
        bws_torch.append(bandwidth(lambda x: x.sum(), probe, reps=3))
        bws_4k.append(bandwidth(read, probe, reps=3) if native else 0.0)
        bws_2m.append(bandwidth(read, probe_huge, reps=3) if native else 0.0)
        bws_far.append(bandwidth(read_far, probe_huge, reps=3) if native else 0.0)
        bws.append(max(bws_4k[-1], bws_2m[-1], bws_far[-1], bws_torch[-1]))
        kv.set_length(slot, 0)
        t0 = time.perf_counter()
        logits, _, _ = runner.forward([slot], [prompt], last_only=True)
        kv.set_length(slot, len(prompt))
        t1 = time.perf_counter()
        tok = int(argmax_rows(logits)[0])
        for i in range(a.decode_tokens):
            logits, _, _ = runner.forward([slot], [[tok]], last_only=True)
            kv.set_length(slot, len(prompt) + i + 1)
            tok = int(argmax_rows(logits)[0])
        t2 = time.perf_counter()
        prefill.append(len(prompt) / (t1 - t0))
        decode.append(a.decode_tokens / (t2 - t1))
    prefill, decode, bws, bws_4k, bws_2m, bws_far, bws_torch = (
        v[1:] for v in (prefill, decode, bws, bws_4k, bws_2m, bws_far, bws_torch))
    fractions = [d * wbytes / bw for d, bw in zip(decode, bws)]
    # verify cost curve at a 256-token context: one forward over t new tokens, rolled back. Rounds
    # interleave t = 1..9, so a drift of the machine's speed during the run hits every t alike.
    times = {t: [] for t in range(1, 10)}
    for _ in range(9):
        for t in times:
            kv.set_length(slot, len(prompt))
            t0 = time.perf_counter()
            runner.forward([slot], [prompt[:t]], row_exact=True)  # as spec_step verifies
            times[t].append(time.perf_counter() - t0)
    curve = {t: statistics.median(v) for t, v in times.items()}
    ratios = {t: [x / y for x, y in zip(v, times[1])] for t, v in times.items()}  # paired per round
    bw = statistics.median(bws)
    res = {
        "model": a.model, "quant": eng.model.quant, "threads": a.threads,
        "prefill_tok_s": round(statistics.median(prefill), 2), "decode_tok_s": round(statistics.median(decode), 2),
        "weight_bytes_per_token": wbytes, "bandwidth_GB_s": round(bw / 1e9, 2),
        "bandwidth_4k_GB_s": round(statistics.median(bws_4k) / 1e9, 2),
        "bandwidth_2m_GB_s": round(statistics.median(bws_2m) / 1e9, 2), "probe_2m_huge_share": round(huge_share, 3),
        "bandwidth_2m_far_GB_s": round(statistics.median(bws_far) / 1e9, 2),
        "bandwidth_torch_sum_GB_s": round(statistics.median(bws_torch) / 1e9, 2),
        "ceiling_tok_s": round(bw / wbytes, 2),
        "fraction_of_ceiling": round(statistics.median(fractions), 3),
        "fraction_of_ceiling_range": [round(min(fractions), 3), round(max(fractions), 3)],
        "verify_cost_ratio": {t: round(statistics.median(r), 3) for t, r in ratios.items()},
        "verify_cost_ratio_range": {t: [round(min(r), 3), round(max(r), 3)] for t, r in ratios.items() if t > 1},
        "verify_ms": {t: round(v * 1e3, 2) for t, v in curve.items()},
    }
    print(json.dumps(res))
    if a.json_out:
        with open(a.json_out, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
