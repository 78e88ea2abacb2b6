"""How often a suffix draft of each evidence class is right, per position: the measured priors of
speculative/suffix.py (EVIDENCE_PRIOR). No benchmark prompt is used: the prompts are the head-training
ones (train/prompts.py: tasks about standard-library files and general-domain prompts).

The target answers every prompt greedily (max_tokens each; ``auto`` with 8 slots, whose output is plain
greedy decoding's). Then the answers are replayed, one request after another, through a fresh suffix
proposer: at every output position it drafts from the request's prompt and output so far and from the
earlier answers, and the draft (a tree, at most the suffix cap deep) is matched against what the target
went on to emit. Per evidence class, position i counts as tried when
positions 1 .. i-1 were right, as the controller's records count it (speculative/controller.py), so the
printed rates are its per-position acceptances given the earlier ones.

    python scripts/suffix_class_priors.py --prompts 128 --max-tokens 128
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POSITIONS = 4  # per class: acceptance at draft positions 1 .. POSITIONS (the last one repeats beyond)
MIN_TRIES = 40  # a position tried fewer times is left out of the printed table (the one before repeats)


def answers(model: str, prompts: list[str], max_tokens: int, threads: int) -> list[tuple[list[int], list[int]]]:
    from specdecode import LLM, SamplingParams

    llm = LLM(model, spec_type="auto", max_num_seqs=8, threads=threads)
    enc = [llm.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    outs = llm.generate(enc, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [(e, o.token_ids) for e, o in zip(enc, outs)]


def replay(pairs: list[tuple[list[int], list[int]]]) -> dict[int, list[list[int]]]:
    """{class: [[tries, hits] per position]} over every output position of every answer, in order, drafted by
    the engine's own suffix proposer (so the drafts and their classes are exactly the engine's)."""
    from types import SimpleNamespace

    from specdecode.config import SpecConfig
    from specdecode.speculative.suffix import SuffixProposer

    prop = SuffixProposer(SpecConfig(spec_type="suffix"))
    counts: dict[int, list[list[int]]] = collections.defaultdict(lambda: [[0, 0] for _ in range(POSITIONS)])
    for prompt, out in pairs:
        seq = SimpleNamespace(draft_state=None, prompt_ids=prompt, tokens=list(prompt))
        for t in range(len(out) - 1):  # the root is out[t]; the draft continues after it
            seq.tokens = prompt + out[:t + 1]
            tree = prop.propose([seq], [min(prop.max_tokens, len(out) - t - 1)])[0]
            if not len(tree):
                continue
            right = tree.match(out[t + 1:])
            rows = counts[tree.evidence]
            for i in range(min(max(tree.depths()), right + 1, POSITIONS)):
                rows[i][0] += 1
                rows[i][1] += i < right
        prop.release(seq)  # its answer joins the cache's global tree
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", type=int, default=128, help="half standard-library tasks, half general-domain")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.train.data import stdlib_files
    from specdecode.train.prompts import distill_prompts, general_prompts

    half = a.prompts // 2
    prompts = distill_prompts(stdlib_files(), half, a.seed) + general_prompts(a.prompts - half, a.seed)
    counts = replay(answers(a.model, prompts, a.max_tokens, a.threads))
    print("class: drafts; per position hits/tries = rate")
    table = {}
    for c in sorted(counts):
        rows = counts[c]
        print(f"{c}: {rows[0][0]}; " + ", ".join(f"{h}/{n} = {h / n:.2f}" for n, h in rows if n))
        kept = []
        for n, h in rows:
            if n < MIN_TRIES:
                break
            kept.append(round(h / n, 2))
        if kept:
            table[c] = tuple(kept)
    print("EVIDENCE_PRIOR =", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
