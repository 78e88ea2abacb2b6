"""The bundled EAGLE-3 head run in int8 against int4 beside the int4 1.5B target, in one process: two
engines over the same target weights, one head each, answering the same prompts in turns (the order
flipped per prompt), greedy, --draft-fixed with --draft-max 3 so that every step proposes a 3-level
chain. Prints, per prompt and format, the median time of a proposal, tau and the acceptance per draft
position (drafts accepted there / drafts made there), and the medians over prompts.

    python scripts/ab_head_format.py --categories coding,writing,roleplay --limit 2
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
    ap.add_argument("--categories", default="coding,writing,roleplay")
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts
    from specdecode.loader.eagle_ckpt import load_head
    from specdecode.heads import find_head

    opts = dict(spec_type="eagle3", threads=a.threads, max_num_seqs=1, draft_fixed=True, draft_max=3)
    engines, times, first = {}, {}, None
    for fmt in ("int8", "int4"):
        llm = LLM(a.model, **opts, **({"_model": first.engine.model, "_tokenizer": first.tokenizer} if first else {}))
        first = first or llm
        eng = llm.engine
        prop = eng.proposer
        model = eng.model
        head = load_head(find_head(a.model, "eagle3"), model.cfg, torch.float32, "cpu")
        prop.head = head.bind(model).quantize(fmt)  # the proposer's own choice replaced by this format
        spent: list[float] = []
        propose = prop.propose

        def timed(*args, _f=propose, _s=spent, **kw):
            t0 = time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                _s.append(time.perf_counter() - t0)
        prop.propose = timed
        engines[fmt], times[fmt] = eng, spent
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    order = list(engines)
    summary = {fmt: ([], []) for fmt in order}
    for p in load_prompts(a.prompts, a.categories.split(","), limit=a.limit):
        ids = first.encode_chat([{"role": "user", "content": p.text}])
        order.reverse()
        for fmt in order:
            eng = engines[fmt]
            eng.reset_prefix_cache()
            times[fmt].clear()
            seq = eng.add_request(list(ids), params)
            while not seq.finished:
                eng.step()
            st = seq.stats
            ms = statistics.median(times[fmt][1:]) * 1e3  # the first proposal feeds the prompt
            per_pos = [round(x / d, 2) for x, d in zip(st.accepted_per_position, st.drafted_per_position)]
            summary[fmt][0].append(ms)
            summary[fmt][1].append(st.mean_acceptance_length)
            print(f"{p.category}/{p.id} {fmt}: proposal {ms:.2f} ms, tau {st.mean_acceptance_length:.2f}, "
                  f"acceptance per position {per_pos}", flush=True)
    for fmt, (ms, tau) in summary.items():
        print(f"{fmt}: proposal median {statistics.median(ms):.2f} ms ({min(ms):.2f}-{max(ms):.2f}), "
              f"tau median {statistics.median(tau):.2f}, mean {statistics.mean(tau):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
