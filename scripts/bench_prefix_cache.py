"""Time to first token with and without prefix caching: a chat whose turns share a long system
prompt (the multi-turn / shared-system-prompt case of a server).

    python scripts/bench_prefix_cache.py --model qwen2.5-coder-1.5b-instruct --threads 2

The same engine serves the same requests twice, prefix cache on then off; the first request of each
pass is excluded (nothing to reuse yet). Prints one JSON line with the median TTFT of each pass."""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

SYSTEM = ("You are a careful Python reviewer. The project's coding rules follow.\n"
          + Path(argparse.__file__).read_text()[:5000])  # ~1.2k tokens of shared context
QUESTIONS = ["What does parse_known_args return?", "How are mutually exclusive groups checked?",
             "Explain the role of the HelpFormatter class.", "Where are default values applied?",
             "What happens on an unknown option?"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8)
    a = ap.parse_args()
    from specdecode import LLM, SamplingParams
    from specdecode.engine.prefix_cache import PrefixCache

    llm = LLM(a.model, threads=a.threads)
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    prompts = [llm.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
               for q in QUESTIONS]
    out = {"model": a.model, "prompt_tokens": [len(p) for p in prompts]}
    for label, cache in (("prefix_cache", PrefixCache(llm.engine.kv)), ("no_prefix_cache", None)):
        llm.engine.prefix_cache = cache
        ttft, texts = [], []
        for p in prompts:
            o = llm.generate(p, params)[0]
            ttft.append(o.stats["time_to_first_token_s"])
            texts.append(o.token_ids)
        out[label] = {"ttft_median_s": round(statistics.median(ttft[1:]), 3), "ttft_s": [round(x, 3) for x in ttft]}
        out[label + "_outputs"] = texts
    out["identical_outputs"] = out.pop("prefix_cache_outputs") == out.pop("no_prefix_cache_outputs")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
