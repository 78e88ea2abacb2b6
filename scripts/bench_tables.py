"""Markdown tables for docs/benchmarks.md from `specdecode bench --json-out` files.

    python scripts/bench_tables.py out/r4_bench_greedy.json [more.json ...]

Per category: plain tok/s, then τ / speed-up (and acceptance) of every configuration; a last line
gives where the decode time went (draft / verify shares of the decode phase, all prompts)."""
from __future__ import annotations

import json
import sys

ORDER = ("coding", "writing", "translation", "summarization", "qa", "math_reasoning", "rag", "all")


def markdown(path: str) -> str:
    d = json.load(open(path))
    s = d["summary"]
    cfgs = [c for c in s["all"] if c != "none"]
    lines = [f"`{' '.join(d['meta']['argv'][1:])}`", "",
             "| category | none tok/s | " + " | ".join(f"{c}: τ / acc / speed-up" for c in cfgs) + " |",
             "|---|---:|" + "---:|" * len(cfgs)]
    for cat in ORDER:
        if cat not in s:
            continue
        row = s[cat]
        cells = []
        for c in cfgs:
            f = row.get(c)
            cells.append("-" if f is None else
                         f"{f['tau']:.2f} / {100 * f['acceptance_rate']:.0f} % / {f['speedup']:.2f}x")
        lines.append(f"| {cat} ({row['none']['prompts']}) | {row['none']['decode_tokens_per_s']:.2f} | "
                     + " | ".join(cells) + " |")
    a = s["all"]
    lines.append("")
    lines.append("Decode time shares (all prompts): " + "; ".join(
        f"{c} draft {100 * a[c]['draft_share']:.0f} % / verify {100 * a[c]['verify_share']:.0f} %" for c in cfgs))
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(markdown(p))
        print()
