"""Where `auto` (or any configuration) spends in a full batch, step by step, beside `none` in turns:
each step's gate state (open, gated, or no gate), planning, proposal and verify times, the rows it
verified and the drafts it verified and accepted, and its time outside the forward (the step's wall
time less those three). Prints per repetition the totals, a line per gate state (medians per step) and
the sequence of states (o open, g gated, m merged: prompt chunks rode in it, - no gate) and of batch
sizes. With --requests, later prompts join as slots free (a server's closed loop). A fresh engine of the
configuration every repetition; `none` serves them all.

    python scripts/bench_gate_steps.py --spec-type auto --batch 8 --reps 3
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_interleaved import units  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-type", default="auto")
    ap.add_argument("--prompts", default="../shared/datasets/spec_bench/question.jsonl")
    ap.add_argument("--batch", type=int, default=8, help="slots, and prompts (the categories' first, then second ones)")
    ap.add_argument("--requests", type=int, help="prompts per repetition (default: --batch): later ones join as "
                                                 "slots free, their prompts riding in the decoders' steps")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import load_prompts
    from specdecode.engine import draft_plan

    steps: list[dict] = []  # the planner's view of each step of the measured engine
    observe = draft_plan.DraftPlanner.observe

    def recording(self, batch, results, timing, plan_s, merged, context=0):
        steps.append(dict(batch=batch, gated=self.gated, plan=plan_s, propose=timing.propose_s,
                          verify=timing.verify_s, rows=timing.verify_rows, drafted=sum(r.drafted for r in results),
                          accepted=sum(r.accepted for r in results), merged=merged))
        return observe(self, batch, results, timing, plan_s, merged, context)

    draft_plan.DraftPlanner.observe = recording
    warm = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    none = LLM(a.model, spec_type="none", threads=a.threads, max_num_seqs=a.batch)
    none.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)
    n = max(a.batch, a.requests or a.batch)
    (_, prompts), *_ = units(load_prompts(a.prompts, None, limit=n), None, n)
    ids = [none.encode_chat([{"role": "user", "content": p.text}]) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    for rep in range(a.reps):
        llm = LLM(a.model, spec_type=a.spec_type, threads=a.threads, max_num_seqs=a.batch,
                  _model=none.engine.model, _tokenizer=none.tokenizer)
        llm.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)  # calibration
        engines = {"none": none.engine, a.spec_type: llm.engine}
        none.engine.reset_prefix_cache()
        seqs = [e.add_request(list(x), params) for e in engines.values() for x in ids]
        walls: dict[str, list[tuple[float, dict | None]]] = {k: [] for k in engines}
        while not all(s.finished for s in seqs):
            for k, e in engines.items():
                if e.has_work():
                    n = len(steps)
                    t0 = time.perf_counter()
                    e.step()
                    walls[k].append((time.perf_counter() - t0, steps[-1] if len(steps) > n else None))
        steps.clear()
        total = {k: sum(w for w, _ in v) for k, v in walls.items()}
        print(f"rep {rep}: none {total['none']:.2f} s, {a.spec_type} {total[a.spec_type]:.2f} s, "
              f"none / {a.spec_type} {total['none'] / total[a.spec_type]:.3f}")
        for k, v in walls.items():
            for state, name in ((True, "gated"), (False, "open"), (None, "no gate")):
                rows = [(w, r) for w, r in v if r is not None and r["gated"] is state]
                if not rows:
                    continue
                med = lambda f: 1e3 * statistics.median(f(w, r) for w, r in rows)  # noqa: E731
                outside = [(w, r) for w, r in rows if not r["merged"]]
                out = (1e3 * statistics.median(w - r["plan"] - r["propose"] - r["verify"] for w, r in outside)
                       if outside else float("nan"))
                print(f"  {k} {name}: {len(rows)} steps, planning {med(lambda w, r: r['plan']):.3f} ms, "
                      f"proposal {med(lambda w, r: r['propose']):.3f} ms, "
                      f"verify {med(lambda w, r: r['verify']):.2f} ms, "
                      f"outside the forward {out:.3f} ms, rows {sum(r['rows'] for _, r in rows)}, "
                      f"drafted {sum(r['drafted'] for _, r in rows)}, accepted {sum(r['accepted'] for _, r in rows)}")
        print("  states: " + "".join("m" if r["merged"] else "g" if r["gated"] else "o" if r["gated"] is False
                                     else "-" for _, r in walls[a.spec_type] if r is not None))
        print("  batch sizes: " + " ".join(f"{b}x{len(list(g))}" for b, g in itertools.groupby(
            r["batch"] for _, r in walls[a.spec_type] if r is not None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
