"""Plain decode after a long context, specdecode beside llama.cpp in one run: tok/s of --tokens greedy tokens
after D tokens already in the cache, for each D of --depths, on the same GGUF.

    python scripts/bench_depth.py --llama-bin "$(../shared/peers/build-llama-cpp)" --depths 0,1024,2048,4096

llama.cpp's figure is ``llama-bench -p 0 -n N -d D`` (its default cache, f16, and flash attention on
``auto``); ours is ``stats.decode_tokens_per_s`` of a request whose prompt is D random token ids (first
token to last; the cache is bf16, the ``cpu-native`` attention). Every round runs both engines at every
depth, the engines in alternating order, so that a drift of the machine's speed hits both alike; a figure
is the median over rounds, and the ratio is paired within each round."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def theirs(bin_dir: Path, gguf: str, depth: int, tokens: int, threads: int) -> float:
    """llama-bench's generation tok/s at this depth (one repetition)."""
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", gguf, "-t", str(threads), "-p", "0", "-n", str(tokens),
                          "-d", str(depth), "-r", "1", "-o", "jsonl"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["avg_ts"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="the folder holding llama-bench (build-llama-cpp prints it)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--depths", default="0,1024,2048")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated after the context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.store import resolve_model

    depths = [int(d) for d in a.depths.split(",")]
    llm = LLM(a.model, spec_type="none", threads=a.threads, max_model_len=max(depths) + a.tokens + 64)
    gguf = str(resolve_model(a.model))
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    prompts = {d: torch.randint(1000, 100000, (max(d, 1),), generator=gen).tolist() for d in depths}
    llm.generate([prompts[depths[0]][:16]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))

    def ours(d: int) -> float:
        llm.reset_prefix_cache()
        return llm.generate([prompts[d]], params)[0].stats["decode_tokens_per_s"]

    got: dict[int, dict[str, list[float]]] = {d: {"ours": [], "theirs": []} for d in depths}
    for r in range(a.rounds):
        for d in depths:
            order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
            for who in order:
                got[d][who].append(ours(d) if who == "ours" else theirs(Path(a.llama_bin), gguf, d, a.tokens, a.threads))
            print(f"round {r} depth {d}: ours {got[d]['ours'][-1]:.2f}, llama.cpp {got[d]['theirs'][-1]:.2f} tok/s",
                  flush=True)
    print("| depth | specdecode tok/s | llama.cpp tok/s | ours / theirs (paired, median and range) |")
    print("|---:|---:|---:|---:|")
    for d in depths:
        o, t = got[d]["ours"], got[d]["theirs"]
        ratios = [x / y for x, y in zip(o, t)]
        print(f"| {d} | {statistics.median(o):.2f} | {statistics.median(t):.2f} | "
              f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
