"""What keeping a drafter's state across prefix-cache hits saves (speculative/kept.py): on MT-bench's
two-turn prompts of Spec-Bench, each configuration answers turn 1, then the same prompt again (a hit on
the whole prompt), then turn 2 (a hit on turn 1 and its answer). A "~cold" twin of each configuration
frees the kept state instead of resuming it, so its drafter starts cold after a hit, as before the
change. Both twins run over one target in one process; their order alternates per prompt.

    python scripts/bench_kept_state.py --spec-types eagle3,auto --limit 2 --json-out out/kept.json

Prints per configuration the medians of time to first token and decode tok/s (prompt again, turn 2)
and the per-prompt ratios of each configuration to its cold twin."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KEYS = ("again_ttft_s", "again_tok_s", "turn2_ttft_s", "turn2_tok_s")


def make_cold(llm) -> None:
    """Every kept state of llm's drafters is freed at the next request's start, never resumed."""
    prop = llm.engine.proposer
    for m in getattr(prop, "members", [prop]):
        kept = getattr(m, "_kept", None)
        if kept is not None:  # keep(seq, None) frees what the slot kept and keeps nothing
            kept.take = lambda seq, kept=kept: kept.keep(seq, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--spec-types", default="eagle3,auto")
    ap.add_argument("--limit", type=int, default=2, help="two-turn prompts per category")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    from specdecode import LLM, SamplingParams
    from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts
    from specdecode.store import resolve_model

    model = str(resolve_model(a.model))
    base = LLM(model, spec_type="none", threads=a.threads, max_num_seqs=1)
    llms = {}
    for s in [s.strip() for s in a.spec_types.split(",") if s.strip()]:
        for cold in (False, True):
            llm = LLM(model, spec_type=s, threads=a.threads, max_num_seqs=1, _model=base.engine.model,
                      _tokenizer=base.tokenizer)
            if cold:
                make_cold(llm)
            llms[s + ("~cold" if cold else "")] = llm
    params = SamplingParams(temperature=0, max_tokens=a.max_tokens)
    for llm in llms.values():  # one-off costs (allocation, calibration) out of the figures
        llm.generate(llm.encode_chat([{"role": "user", "content": "Say hi."}]), SamplingParams(temperature=0, max_tokens=8))
    per_cat: dict[str, list] = {}
    for p in load_prompts(DEFAULT_PROMPTS):
        if len(p.turns) > 1 and len(per_cat.setdefault(p.category, [])) < a.limit:
            per_cat[p.category].append(p)
    records = []
    for i, p in enumerate(q for ps in per_cat.values() for q in ps):
        for name in (list(llms) if i % 2 == 0 else list(llms)[::-1]):
            llm = llms[name]
            msgs = [{"role": "user", "content": p.turns[0]}]
            first = llm.generate(llm.encode_chat(msgs), params)[0]
            again = llm.generate(llm.encode_chat(msgs), params)[0]
            msgs += [{"role": "assistant", "content": first.text}, {"role": "user", "content": p.turns[1]}]
            second = llm.generate(llm.encode_chat(msgs), params)[0]
            r = {"prompt": f"{p.category}/{p.id}", "config": name,
                 "again_ttft_s": again.stats["time_to_first_token_s"], "again_tok_s": again.stats["decode_tokens_per_s"],
                 "turn2_ttft_s": second.stats["time_to_first_token_s"], "turn2_tok_s": second.stats["decode_tokens_per_s"],
                 "turn2_prompt_tokens": second.stats["prompt_tokens"], "again_same": again.token_ids == first.token_ids}
            records.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print("| config | prompt again: TTFT | tok/s | turn 2: TTFT | tok/s |")
    print("|---|---:|---:|---:|---:|")
    for name in llms:
        rs = [r for r in records if r["config"] == name]
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[k] for r in rs):.3f}" for k in KEYS) + " |")
    for name in [n for n in llms if not n.endswith("~cold")]:
        new = {r["prompt"]: r for r in records if r["config"] == name}
        old = {r["prompt"]: r for r in records if r["config"] == name + "~cold"}
        for k in KEYS:
            q = sorted(new[p][k] / old[p][k] for p in new)
            print(f"{name} / cold, {k}: median {statistics.median(q):.3f} ({q[0]:.3f}-{q[-1]:.3f})")
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json_out).write_text(json.dumps({"argv": sys.argv, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
