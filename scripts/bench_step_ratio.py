"""Decode step of a draft model over the target's, both loaded in one process and stepped in turns,
one step each (so that a drift of the machine's memory bandwidth hits both alike).

    python scripts/bench_step_ratio.py --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct

A step is one single-token forward with logits at a 256-token context and the pick of its token, as
plain decoding runs it for the target (the native argmax) and as the draft proposer runs it for a
greedy request's draft (its logits, then ``sampling.draft_token``: the argmax and its probability
against --draft-p-min). With --draft-vocab auto, the default, the draft's
LM head keeps only the rows of the target's EAGLE-3 draft vocabulary when the target has a head;
--draft-vocab full times the whole head. Prints per round each model's median step (ms) and their
ratio, then the median and range of the ratios over rounds."""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch


def steps_ms(models, steps: int) -> list[float]:
    """Median ms of each model's ``step(slot)`` (one token after 256 of context); models: (runner, kv,
    step) each. The models step in turns, one step each, the
    order flipped every step, so that the host's drift hits all alike."""
    with contextlib.ExitStack() as stack:
        slots = []
        for runner, kv, _ in models:
            slot = stack.enter_context(kv.scratch_slot())
            runner.forward([slot], [list(range(100, 356))], logits=False)
            kv.set_length(slot, 256)
            slots.append(slot)
        times = [[] for _ in models]
        order = list(range(len(models)))
        for _ in range(steps):
            order.reverse()
            for i in order:
                t0 = time.perf_counter()
                models[i][2](slots[i])
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def target_step(runner):
    from specdecode.sampling import argmax_rows

    return lambda slot: int(argmax_rows(runner.forward([slot], [[5]], last_only=True)[0])[0])


def draft_step(prop, p_min: float, whole_row: bool = False):
    """whole_row: the draft's logits written out over the target's vocabulary (-inf outside its
    sub-vocabulary) before the pick, as the proposer did before it picked on the sub-vocabulary."""
    from specdecode.sampling import draft_token
    from specdecode.sampling_params import SamplingParams

    greedy = SamplingParams(temperature=0)
    ids = prop.vocab

    def step(slot):
        logits = prop._last_logits([slot], [[5]], None)[0]
        if not whole_row or ids is None:
            return draft_token(logits, greedy, None, p_min, ids, prop.target_vocab)
        row = logits.new_full((prop.target_vocab,), float("-inf"))
        row[ids] = logits
        return draft_token(row, greedy, None, p_min)
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--draft-vocab", default="auto", choices=("auto", "full"))
    ap.add_argument("--whole-row", action="store_true",
                    help="also time the draft picking from its logits written out over the target's vocabulary")
    a = ap.parse_args()
    from specdecode.config import EngineConfig, SpecConfig
    from specdecode.engine.engine import Engine

    torch.set_num_threads(a.threads)
    spec = SpecConfig(spec_type="draft", model_draft=a.draft, draft_vocab=a.draft_vocab)
    eng = Engine(EngineConfig(model=a.target, threads=a.threads, max_num_seqs=1, max_model_len=1024, spec=spec))
    prop = eng.proposer
    print(json.dumps({"draft_vocab": a.draft_vocab, "draft_lm_head_rows": None if prop.vocab is None else len(prop.vocab)}))
    timed = [(eng.runner, eng.kv, target_step(eng.runner)), (prop.runner, prop.kv, draft_step(prop, spec.draft_p_min))]
    if a.whole_row:
        timed.append((prop.runner, prop.kv, draft_step(prop, spec.draft_p_min, whole_row=True)))
    steps_ms(timed, 4)  # warm-up
    ratios, whole = [], []
    for r in range(a.rounds):
        t, d, *w = steps_ms(timed, a.steps)
        ratios.append(d / t)
        row = {"round": r, "target_ms": round(t, 2), "draft_ms": round(d, 2), "ratio": round(d / t, 3)}
        if w:
            whole.append(w[0] / t)
            row.update(draft_whole_row_ms=round(w[0], 2), ratio_whole_row=round(whole[-1], 3))
        print(json.dumps(row))
    out = {"ratio_median": round(statistics.median(ratios), 3), "ratio_min": round(min(ratios), 3),
           "ratio_max": round(max(ratios), 3)}
    if whole:
        out.update(ratio_whole_row_median=round(statistics.median(whole), 3), ratio_whole_row_min=round(min(whole), 3),
                   ratio_whole_row_max=round(max(whole), 3))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
