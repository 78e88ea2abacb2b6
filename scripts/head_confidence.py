"""How well an EAGLE head's own probability predicts acceptance: every step drafts (--draft-fixed), and
each first draft token's probability (the head's top probability over its draft vocabulary) is binned
against whether the target accepted it. A head whose low-probability drafts are seldom right could
skip verifying them where a verify row is dear; one whose probabilities say nothing could not.

    python scripts/head_confidence.py --limit 2 --max-tokens 128
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdecode import LLM, SamplingParams  # noqa: E402
from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts  # noqa: E402
from specdecode.speculative import eagle  # noqa: E402

CATEGORIES = ("writing", "coding", "translation", "qa", "math_reasoning", "summarization", "rag", "roleplay",
              "reasoning", "extraction", "stem", "humanities")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    first: list[float] = []  # the first node's probability of each proposal, in order
    select = eagle.select

    def noting(cands, n):  # the chain's candidates: (path log-prob, token, parent, depth)
        first.append(math.exp(cands[0][0]))
        return select(cands, n)

    eagle.select = noting
    pending: dict[int, float] = {}
    outcomes: list[tuple[float, bool]] = []
    llm = LLM(a.model, spec_type="eagle3", threads=a.threads, max_num_seqs=1, draft_fixed=True)
    prop = llm.engine.proposer
    propose, observe = prop.propose, prop.observe

    def proposing(seqs, ks):
        first.clear()
        trees = propose(seqs, ks)
        for seq, p in zip([s for s, t in zip(seqs, trees) if len(t)], first):
            pending[id(seq)] = p
        return trees

    def observing(seq, k, drafted, accepted):
        p = pending.pop(id(seq), None)
        if p is not None and drafted:
            outcomes.append((p, accepted >= 1))
        return observe(seq, k, drafted, accepted)

    prop.propose, prop.observe = proposing, observing
    for q in load_prompts(a.prompts, list(CATEGORIES), a.limit):
        llm.generate(llm.encode_chat([{"role": "user", "content": q.text}]), SamplingParams(temperature=0, max_tokens=a.max_tokens))
    bins = [[0, 0] for _ in range(10)]
    for p, ok in outcomes:
        b = bins[min(9, int(p * 10))]
        b[0] += 1
        b[1] += ok
    print("| first draft token's probability | " + " | ".join(f"{i / 10:.1f}-{(i + 1) / 10:.1f}" for i in range(10)) + " |")
    print("|---|" + "---:|" * 10)
    print("| drafts | " + " | ".join(str(n) for n, _ in bins) + " |")
    print("| accepted | " + " | ".join(f"{k / n:.2f}" if n else "-" for n, k in bins) + " |")
    print(f"{len(outcomes)} drafts, {sum(ok for _, ok in outcomes) / max(1, len(outcomes)):.2f} accepted")


if __name__ == "__main__":
    main()
