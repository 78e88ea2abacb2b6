"""Where a drafter's time goes in a full batch: Spec-Bench's first prompts (16 by default) on 8 slots,
greedy, one fresh engine per spec type (nothing cached: the warm-up request's prompt is forgotten; with
--warm-requests, other prompts are served first, as by a server that has been running), all requests added
at once as a concurrency-8 server level would run them. Prints the wall time, output tok/s, tau, and the
seconds spent in each proposer method (per chain member), the controller and the target's forwards (a
prompt's forward of its own apart from the steps' forwards, with their rows). Spec types run in turns over
--rounds, so drift hits them alike.

    python scripts/bench_batch_drafters.py --spec-types none,auto,ngram-mod,eagle3 --rounds 2
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


def timed(obj, name: str, label: str, into: collections.Counter) -> None:
    f = getattr(obj, name)

    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            into[label] += time.perf_counter() - t0
    setattr(obj, name, g)


def run(spec_type: str, a, shared: dict) -> tuple[float, int, float, collections.Counter]:
    from specdecode.bench.prompts import load_prompts
    from specdecode.llm import LLM
    from specdecode.sampling_params import SamplingParams

    llm = LLM(a.model, spec_type=spec_type, max_num_seqs=a.slots, threads=a.threads,
              _model=shared.get("model"), _tokenizer=shared.get("tok"))
    shared.setdefault("model", llm.engine.model)
    shared.setdefault("tok", llm.engine.tokenizer)
    eng = llm.engine
    prompts = load_prompts(a.prompts, None, None)
    ids = [llm.encode_chat([{"role": "user", "content": p.text}]) for p in prompts[:a.requests]]
    llm.generate(ids[0], SamplingParams(max_tokens=8, temperature=0))  # calibration happens here
    if a.warm_requests:  # other prompts first, as a server that has been running: records, costs, pools
        warm = prompts[a.requests:a.requests + a.warm_requests]
        llm.generate([llm.encode_chat([{"role": "user", "content": p.text}]) for p in warm],
                     SamplingParams(max_tokens=a.max_tokens, temperature=0))
    eng.reset_prefix_cache()
    parts = collections.Counter()
    for m in getattr(eng.proposer, "members", [eng.proposer]):
        for name in ("prefill", "propose", "commit", "release"):
            timed(m, name, f"{m.name}.{name}", parts)
    timed(eng, "_draft_lengths", "controller", parts)
    forward = eng.runner.forward

    def split(slots, tokens, *args, **kw):  # a prompt's forward of its own (no logits) or a step's
        kind = "prompt forwards" if kw.get("logits", True) is False else "step forwards"
        t0 = time.perf_counter()
        try:
            return forward(slots, tokens, *args, **kw)
        finally:
            parts[kind] += time.perf_counter() - t0
            parts[kind.replace("forwards", "rows (count)")] += sum(map(len, tokens))
    eng.runner.forward = split
    params = SamplingParams(max_tokens=a.max_tokens, temperature=0)
    seqs = [eng.add_request(i, params) for i in ids]
    t0 = time.perf_counter()
    while any(not s.finished for s in seqs):
        eng.step()
    wall = time.perf_counter() - t0
    steps = sum(s.stats.steps for s in seqs)
    tau = 1 + sum(s.stats.accepted_tokens for s in seqs) / max(1, steps)
    parts["gated steps (count)"] = eng.planner.gated_steps
    return wall, sum(len(s.output_ids) for s in seqs), tau, parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-types", default="none,auto")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warm-requests", type=int, default=0,
                    help="serve this many other prompts (those after the measured ones) first, untimed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shared: dict = {}
    types = a.spec_types.split(",")
    walls = {t: [] for t in types}
    for r in range(a.rounds):
        for t in types:
            wall, tokens, tau, parts = run(t, a, shared)
            walls[t].append(wall)
            print(f"round {r + 1} {t}: {wall:.2f} s, {tokens / wall:.1f} tok/s, tau {tau:.2f}; " +
                  ", ".join(f"{k} {v:.0f}" if "(count)" in k else f"{k} {v:.2f} s"
                            for k, v in parts.most_common() if v >= 0.005), flush=True)
    base = statistics.median(walls[types[0]])
    for t in types:
        print(f"{t}: median {statistics.median(walls[t]):.2f} s ({min(walls[t]):.2f}-{max(walls[t]):.2f}), "
              f"{base / statistics.median(walls[t]):.2f}x the speed of {types[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
