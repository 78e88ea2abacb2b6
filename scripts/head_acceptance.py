"""A bundled (or --spec-head) EAGLE-3 head's acceptance on prompts like its training data against
Spec-Bench's, through the engine: tells a head that is wrong from a head that meets text it never saw.

    python scripts/head_acceptance.py --model qwen2.5-coder-1.5b-instruct --n 8

In-distribution prompts come from train-head's own generators (distill_prompts over the standard
library, general_prompts) with seeds the training never used; Spec-Bench's are the first --n of its
six categories (MT-bench counted as one). Greedy, --draft-fixed (every step drafts the whole tree), so
tau and the per-position acceptance are the head's, not the controller's. Prints one JSON line per set.
"""
from __future__ import annotations

import argparse
import json
import statistics

from specdecode import LLM, SamplingParams
from specdecode.bench.prompts import DEFAULT_PROMPTS, MT_BENCH, load_prompts
from specdecode.train.data import stdlib_files
from specdecode.train.prompts import distill_prompts, general_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-head", default=None)
    ap.add_argument("--n", type=int, default=8, help="prompts per set (split between its halves)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    half = max(1, a.n // 2)
    sets = {
        # seeds far from train-head's (which uses --seed and its small offsets)
        "in-distribution": distill_prompts(stdlib_files(), half, seed=12345)[:half] + general_prompts(half, seed=999),
        "spec-bench": [],
    }
    seen: dict[str, int] = {}
    for p in load_prompts(DEFAULT_PROMPTS):
        cat = "mt_bench" if p.category in MT_BENCH else p.category
        if seen.get(cat, 0) < max(1, a.n // 6):
            seen[cat] = seen.get(cat, 0) + 1
            sets["spec-bench"].append(p.text)
    llm = LLM(a.model, spec_type="eagle3", draft_fixed=True, threads=a.threads,
              **({"head": a.spec_head} if a.spec_head else {}))
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    for name, prompts in sets.items():
        taus, acc, tried = [], [0] * 8, [0] * 8
        for text in prompts:
            s = llm.chat([{"role": "user", "content": text}], params).stats["spec"]
            taus.append(s["mean_acceptance_length"])
            for i, (x, n) in enumerate(zip(s["accepted_per_position"], s["drafted_per_position"])):
                acc[i] += x
                tried[i] += n
        print(json.dumps({"set": name, "prompts": len(prompts), "tau_mean": round(statistics.mean(taus), 3),
                          "tau_min": round(min(taus), 3), "tau_max": round(max(taus), 3),
                          "acceptance_per_position": [round(x / n, 3) for x, n in zip(acc, tried) if n]}))


if __name__ == "__main__":
    main()
