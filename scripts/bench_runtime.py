"""Single-stream runtime figures for docs/benchmarks.md: prefill and decode tok/s, the decode
ceiling (weight bytes read per token / measured memory bandwidth), and the verify cost curve
v(t)/v(1) for t = 1..9 new tokens.

    python scripts/bench_runtime.py --model qwen2.5-coder-1.5b-instruct --quant int4 --threads 2

Every figure is a median over --reps runs in this process. Bandwidth is measured here, in the same
process and thread count, by summing a 1 GiB float32 tensor (a pure streaming read), right before
each decode run: the host's bandwidth drifts by tens of percent within minutes, so each run's
fraction of the ceiling is its decode against its own probe, and the median and range of those
fractions are reported. The verify curve's ratios are likewise paired within each of 9 rounds
(median and range over the rounds)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def bandwidth(x: torch.Tensor, reps: int = 5) -> float:
    """Bytes per second of x.sum(), median of reps; x: 1 GiB float32, far beyond any cache."""
    x.sum()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
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
    prefill, decode, bws = [], [], []
    for _ in range(a.reps + 1):  # the first round warms up and is dropped
        bws.append(bandwidth(probe, reps=3))
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
    prefill, decode, bws = prefill[1:], decode[1:], bws[1:]
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
