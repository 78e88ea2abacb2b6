"""Spec-Bench's six categories from a `specdecode bench` JSON:

    python scripts/spec_bench_categories.py out/<bench>.json

MT-bench's eight sub-categories form "multi-turn"; its "coding" sub-category is also shown on its
own. Per category and over all: the speed-up of decode tok/s over none on the same prompts (total
decode time of none / of the configuration, per generated token), tau, and how many outputs equal
none's token for token (counted per turn: MT-bench's prompts have two). Prints a Markdown table."""
from __future__ import annotations

import collections
import json
import sys

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
COLUMNS = ["multi-turn", "coding", "translation", "summarization", "qa", "math_reasoning", "rag", "ALL"]


def groups(category: str) -> list[str]:
    out = ["multi-turn" if category in MT_BENCH else category, "ALL"]
    return out + (["coding"] if category == "coding" else [])


def main(path: str) -> None:
    recs = json.load(open(path))["records"]
    # config -> column -> [decode seconds, decoded tokens, steps, accepted tokens]
    acc = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0, 0, 0]))
    key = lambda r: (r["prompt_id"], r.get("turn", 0))  # one record per turn of a prompt
    plain = {key(r): r["token_ids"] for r in recs if r["config"] == "none"}
    same, total = collections.Counter(), collections.Counter()
    for r in recs:
        for col in groups(r["category"]):
            a = acc[r["config"]][col]
            a[0] += r["decode_s"]
            a[1] += r["completion_tokens"] - 1
            a[2] += r["spec"]["steps"]
            a[3] += r["spec"]["accepted_tokens"]
        total[r["config"]] += 1
        same[r["config"]] += r["token_ids"] == plain[key(r)]
    print("| config | " + " | ".join(COLUMNS) + " | outputs = none |")
    print("|---|" + "---:|" * len(COLUMNS) + "---:|")
    for cfg, cols in acc.items():
        cells = []
        for col in COLUMNS:
            s, n, steps, accepted = cols[col]
            if not n:  # a category this run did not select
                cells.append("-")
            elif cfg == "none":
                cells.append(f"{n / s:.1f} tok/s")
            else:
                base_s, base_n = acc["none"][col][:2]
                cells.append(f"{(base_s / base_n) / (s / n):.2f}x (tau {1 + accepted / steps:.2f})")
        print(f"| {cfg} | " + " | ".join(cells) + f" | {same[cfg]}/{total[cfg]} |")


if __name__ == "__main__":
    main(sys.argv[1])
