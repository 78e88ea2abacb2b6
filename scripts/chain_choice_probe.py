"""What a chain's per-step choice leaves on the table: for each step where a draftless member (suffix,
ngram-mod) found a draft, how many of its tokens the target would have accepted, next to what the chosen
member got; and, where the EAGLE head was chosen over a suffix draft, what a merged tree (the union of the
two drafts, which accepts the longer of the two matches) would have accepted.

Greedy, first turns of Spec-Bench prompts, `auto` on the given model. Acceptance of a draft that was not
verified is read off the target's own output afterwards (greedy: the output is the target's argmax, so a
path is accepted exactly as far as it matches the output).

    python scripts/chain_choice_probe.py --category coding --limit 10 --category writing --limit 3
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from specdecode import LLM, SamplingParams
from specdecode.speculative.chain import ChainProposer
from specdecode.speculative.tree import DraftTree

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared/datasets/spec_bench/question.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--category", action="append", required=True)
    ap.add_argument("--limit", type=int, action="append", required=True, help="prompts per --category, in order")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    plans, verified = [], {}
    plan, observe = ChainProposer.plan, ChainProposer.observe

    def recording_plan(self, seqs, rooms, value, fixed=False, verify=None):
        plan(self, seqs, rooms, value, fixed, verify)
        for seq in seqs:
            st = self._st(seq)
            if st.ready:
                chosen = None if st.choice is None else self.members[st.choice].name
                trees = {self.members[i].name: DraftTree(t.tokens[:], t.parents[:]) for i, t in st.ready.items()}
                plans.append((seq, seq.num_tokens, chosen, trees))

    def recording_observe(self, seq, k, drafted, n_accepted):
        if self._st(seq).choice is not None and drafted:
            verified[(seq.seq_id, seq.num_tokens)] = n_accepted
        observe(self, seq, k, drafted, n_accepted)

    ChainProposer.plan, ChainProposer.observe = recording_plan, recording_observe
    by_cat = collections.defaultdict(list)
    for line in SPEC_BENCH.read_text().splitlines():
        q = json.loads(line)
        by_cat[q["category"]].append(q["turns"][0])
    llm = LLM(a.model, spec_type="auto", spec_merge="off", threads=a.threads)  # what the choice alone leaves
    for cat, limit in zip(a.category, a.limit):
        c = collections.Counter()
        for prompt in by_cat[cat][:limit]:
            plans.clear()
            verified.clear()
            llm.generate([llm.encode_chat([{"role": "user", "content": prompt}])],
                         SamplingParams(temperature=0, max_tokens=a.max_tokens))
            for seq, pos, chosen, trees in plans:
                truth = seq.tokens[pos:]
                acc = {m: t.match(truth) for m, t in trees.items()}
                c["steps with a draftless draft"] += 1
                c["of them, two draftless drafts"] += len(trees) > 1
                c[f"chosen {chosen}"] += 1
                got = verified.get((seq.seq_id, pos))
                if chosen == "eagle3" and got is not None and "suffix" in acc:
                    c["head over suffix: steps"] += 1
                    c["head over suffix: head accepted"] += got
                    c["head over suffix: suffix would accept"] += acc["suffix"]
                    c["head over suffix: union would accept"] += max(got, acc["suffix"])
                    c["head over suffix: suffix nodes"] += len(trees["suffix"])
        print(cat, json.dumps(dict(c)), flush=True)


if __name__ == "__main__":
    main()
