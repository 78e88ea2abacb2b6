"""What an EAGLE head's proposal costs in the engine with its step as one native call (models/eagle_native.py)
and with its modules, in one process, the two in turns.

One engine drafts with the head alone (``--spec-type eagle3``, the controller choosing as usual) over
Spec-Bench prompts; the prompts alternate between the fused step and the module path (the fused step
switched off), so a drift of the host's speed weighs on both alike, and every prompt is a distinct one
(no drafter sees an earlier pass's answers). Each proposal is timed as the engine calls it (after the
target's forward has streamed its weights through the caches, where every Python object the proposal
touches is a cache miss). Prints the proposals' median and quartiles per path, and their ratio.

    python scripts/bench_head_step.py --per-category 4
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CATEGORIES = ["coding", "writing", "math", "extraction", "roleplay", "stem", "reasoning", "humanities"]


def main() -> int:
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts
    from specdecode.models import eagle_native

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--per-category", type=int, default=4, help="prompts per MT-bench category (8 categories)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    llm = LLM(a.model, spec_type="eagle3", threads=a.threads, max_num_seqs=1)
    llm.generate([1, 2, 3, 4, 5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=8))
    proposer = llm.engine.proposer
    propose, fused_step = proposer.propose, eagle_native.NativeStep.step
    times: dict[str, list[float]] = {"fused": [], "modules": []}
    path = ["fused"]

    def timed(seqs, max_tokens):
        t0 = time.perf_counter()
        out = propose(seqs, max_tokens)
        times[path[0]].append(time.perf_counter() - t0)
        return out

    proposer.propose = timed
    prompts = load_prompts(a.prompts, CATEGORIES, a.per_category)
    for i, p in enumerate(prompts):
        path[0] = "fused" if i % 2 == 0 else "modules"
        eagle_native.NativeStep.step = fused_step if path[0] == "fused" else (lambda *args, **kw: None)
        llm.generate(llm.encode_chat([{"role": "user", "content": p.text}]),
                     SamplingParams(temperature=0, max_tokens=a.max_tokens))
    eagle_native.NativeStep.step = fused_step
    med = {}
    for name, t in times.items():
        q = statistics.quantiles(t, n=4)
        med[name] = statistics.median(t)
        print(f"{name:8s} proposals {len(t):4d}  median {1e3 * med[name]:.3f} ms  "
              f"(quartiles {1e3 * q[0]:.3f}-{1e3 * q[2]:.3f})")
    print(f"fused / modules: {med['fused'] / med['modules']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
