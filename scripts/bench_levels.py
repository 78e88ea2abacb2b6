"""The engine's own c8 / c1 on bench-serve's workload, without the server, the two levels in turns.

bench-serve runs its levels one after the other: its c = 1 level takes ~50 s and its c = 8 level
~12-16 s, and a host whose speed moves by 20-30 % within minutes moves their ratio by as much. Here both
run in one process over the same weights: the c = 8 workload (every request queued at once on --max-num-seqs slots, as a
closed loop of 8 clients keeps them, later ones joining as slots free) alternates with a quarter of
the c = 1 level (its requests one at a time), four times over per repetition, so that a drift weighs on
both levels alike. Each c = 8 run and each repetition's c = 1 level get a fresh engine over the same
weights, as bench-serve's levels a fresh server: no prefix and no drafter carries an earlier run's outputs.
Prints each repetition's tok/s per level and their ratio, then the median ratio. With --steps, also where
each c = 8 run's time went: its engine steps classed by decoders and whether they prefilled.

    python scripts/bench_levels.py --spec-type none --reps 2
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-type", default="none")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--requests", type=int, default=16, help="requests per level: the file's first ones, as bench-serve")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-num-seqs", type=int, default=8, help="slots: the c = 8 level's concurrency")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", action="store_true", help="the c = 8 runs' steps classed (module doc)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts

    base = LLM(a.model, spec_type="none", threads=a.threads, max_num_seqs=1)
    prompts = load_prompts(a.prompts)
    ids = [base.encode_chat([{"role": "user", "content": prompts[i % len(prompts)].text}]) for i in range(a.requests)]
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens)  # EOS ends a request, as in bench-serve
    warm = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def fresh():
        llm = LLM(a.model, spec_type=a.spec_type, threads=a.threads, max_num_seqs=a.max_num_seqs,
                  _model=base.engine.model, _tokenizer=base.tokenizer)
        llm.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)  # calibration
        llm.engine.reset_prefix_cache()
        return llm.engine

    steps: dict[tuple[bool, int], list[float]] = collections.defaultdict(list)  # (prefilled, decoders) -> seconds
    prompt_tokens = [0]

    def run(eng, batch: list[list[int]], record: bool = False) -> tuple[int, float]:
        """Queues ``batch`` at once and steps the engine until it is done: (tokens, seconds)."""
        t0 = time.perf_counter()
        seqs = [eng.add_request(list(x), params) for x in batch]
        while eng.has_work():
            before = sum(s.num_prefilled for s in seqs) - eng.prefix_cache.hit_tokens
            decoders = sum(s.num_prefilled >= len(s.prompt_ids) - 1 and not s.finished for s in eng.running)
            t = time.perf_counter()
            eng.step()
            if record:
                fed = sum(s.num_prefilled for s in seqs) - eng.prefix_cache.hit_tokens - before
                steps[fed > 0, decoders].append(time.perf_counter() - t)
                prompt_tokens[0] += fed
        return sum(len(s.output_ids) for s in seqs), time.perf_counter() - t0

    ratios = []
    quarter = -(-len(ids) // 4)
    for rep in range(a.reps):
        n1 = t1 = n8 = t8 = 0.0
        one = fresh()  # the c = 1 level's engine, through its four quarters
        for part in range(4):
            n, t = run(fresh(), ids, a.steps)
            n8, t8 = n8 + n, t8 + t
            for x in ids[part * quarter:(part + 1) * quarter]:
                n, t = run(one, [x])
                n1, t1 = n1 + n, t1 + t
        ratios.append((n8 / t8) / (n1 / t1))
        print(f"rep {rep}: c = 1 {n1 / t1:.1f} tok/s, c = {a.max_num_seqs} {n8 / t8:.1f} tok/s: "
              f"ratio {ratios[-1]:.2f}", flush=True)
    if a.steps:
        print(f"c = {a.max_num_seqs} steps over all runs ({prompt_tokens[0]} prompt tokens prefilled):")
        for (fed, dec), ts in sorted(steps.items()):
            print(f"  {'prefilling' if fed else 'decoding':10s} with {dec} decoders: {len(ts):4d} steps, "
                  f"{sum(ts):6.2f} s, median {1e3 * statistics.median(ts):6.1f} ms")
    print(f"{a.spec_type}: c{a.max_num_seqs} / c1 median {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
