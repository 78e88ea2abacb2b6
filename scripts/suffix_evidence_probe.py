"""How often suffix's drafts are right, by what they rest on: runs `auto` over every --step-th Spec-Bench
prompt (8 slots, greedy) and, for each suffix draft that was verified, records the matched context length
and the probability of its first branch (arctic_inference's SuffixDecodingDraft) with whether its first
token was accepted. Prints acceptance by match length and by first-branch probability: the evidence
classes of speculative/suffix.py.

    python scripts/suffix_evidence_probe.py --requests 48
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from specdecode.bench.prompts import load_prompts
    from specdecode.llm import LLM
    from specdecode.sampling_params import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, spec_type="auto", max_num_seqs=8, threads=a.threads)
    eng, chain = llm.engine, llm.engine.proposer
    suffix = next(i for i, m in enumerate(chain.members) if m.name == "suffix")
    prompts = load_prompts(a.prompts, None, None)
    chosen = prompts[::max(1, len(prompts) // a.requests)][:a.requests]
    ids = [llm.encode_chat([{"role": "user", "content": p.text}]) for p in chosen]

    cache, last = chain.members[suffix].cache, {}

    class Recording:  # the suffix cache, keeping each request's last draft
        def __getattr__(self, name):
            return getattr(cache, name)

        def speculate(self, rid, *args, **kw):
            last[rid] = d = cache.speculate(rid, *args, **kw)
            return d

    chain.members[suffix].cache = Recording()
    rows = []
    observe = chain.observe

    def recording(seq, k, drafted, accepted):
        state = chain._st(seq).members[suffix]
        d = last.pop(state[0], None) if state else None
        if d is not None and d.token_ids and drafted and chain.drafted_by(seq) == "suffix":
            rows.append((d.match_len, d.probs[0], accepted > 0))
        return observe(seq, k, drafted, accepted)

    chain.observe = recording
    llm.generate(ids, SamplingParams(max_tokens=a.max_tokens, temperature=0))
    for name, key in (("match length", lambda r: min(r[0], 8)), ("first-branch probability", lambda r: round(r[1], 1))):
        by = collections.defaultdict(lambda: [0, 0])
        for r in rows:
            by[key(r)][0] += 1
            by[key(r)][1] += r[2]
        print(f"by {name}: " + ", ".join(f"{k}: {h}/{n}" for k, (n, h) in sorted(by.items())))
    print(f"{len(rows)} verified suffix drafts, {sum(r[2] for r in rows)} first tokens accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
