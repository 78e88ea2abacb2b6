"""Two --spec-type configurations on one prompt at a time, stepped alternately (one engine step each in
turn, the order flipped every turn) over the same target weights, so that a drift of the machine's speed,
which on some hosts moves a plain step by 20 % within a minute, hits both alike; bench_vs_llamacpp.py runs
whole requests one after the other and its per-prompt ratios carry that drift. Decode time only (the steps
after the first token); every repetition starts the second configuration's drafters afresh.

    python scripts/bench_interleaved.py --spec-types none,auto --categories roleplay,rag --reps 3
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-types", default="none,auto", help="two configurations: base,other")
    ap.add_argument("--categories", help="comma-separated Spec-Bench categories, the first prompt of each "
                                         "(default: every category)")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts

    first, other = a.spec_types.split(",")
    base = LLM(a.model, spec_type=first, threads=a.threads, max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    warm = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    base.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)
    cats = a.categories.split(",") if a.categories else None
    by_cat = {p.category: p for p in load_prompts(a.prompts, cats, limit=1)}
    ratios = []
    for cat in cats or list(by_cat):
        ids = base.encode_chat([{"role": "user", "content": by_cat[cat].text}])
        for rep in range(a.reps):
            llm = LLM(a.model, spec_type=other, threads=a.threads, max_num_seqs=1,
                      _model=base.engine.model, _tokenizer=base.tokenizer)
            llm.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)  # calibration, kernel build
            base.engine.reset_prefix_cache()  # both prefill the prompt
            engines = {first: base.engine, other: llm.engine}
            seqs = {k: e.add_request(list(ids), params) for k, e in engines.items()}
            spent = dict.fromkeys(engines, 0.0)
            order = list(engines.items())
            while not all(s.finished for s in seqs.values()):
                order.reverse()  # ABBA: neither engine always runs right after the other's forward
                for k, e in order:
                    if seqs[k].finished:
                        continue
                    decoding = len(seqs[k].output_ids) >= 1
                    t0 = time.perf_counter()
                    e.step()
                    if decoding:
                        spent[k] += time.perf_counter() - t0
            if seqs[first].output_ids != seqs[other].output_ids:
                print(f"WARNING: {other} output differs from {first} on {cat}", file=sys.stderr)
            s = seqs[other]
            ratios.append(spent[first] / spent[other])
            print(f"{cat} rep {rep}: {first} {spent[first]:.2f} s, {other} {spent[other]:.2f} s, "
                  f"{other}/{first} speed {ratios[-1]:.3f}, tau {s.stats.mean_acceptance_length:.2f}",
                  flush=True)
        cat_ratios = ratios[-a.reps:]
        print(f"{cat}: median {statistics.median(cat_ratios):.3f} ({min(cat_ratios):.3f}-{max(cat_ratios):.3f})", flush=True)
    print(f"all: median {statistics.median(ratios):.3f}, {sum(r >= 1 for r in ratios)}/{len(ratios)} >= 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
