"""More chats than KV slots: what the host prompt store (--cache-ram) saves on their second turns.

Spec-Bench's first N two-turn questions (MT-bench's), greedy: every chat's first turn is generated
(continuous batching over --slots slots), then every chat's second turn (its first question, the
model's answer, the second question). With two slots and eight chats, a chat's slot holds another
chat by the time its second turn comes. Each --cache-ram setting runs in its own engine, settings in
turns; printed per setting: the second turns' wall time, median time to first token, the prompt
tokens they prefilled, the tokens the slot cache and the store supplied, and whether the outputs
equal the first setting's.

    python scripts/bench_prompt_store.py --chats 8 --slots 2 --cache-ram 0,2048 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdecode import LLM, SamplingParams  # noqa: E402

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "spec_bench" / "question.jsonl"


def two_turn_chats(n: int) -> list[list[str]]:
    chats = []
    for line in QUESTIONS.read_text().splitlines():
        turns = json.loads(line).get("turns", [])
        if len(turns) >= 2:
            chats.append(turns[:2])
        if len(chats) == n:
            break
    return chats


def run(model: str, chats, slots: int, cache_mib: int, max_tokens: int, threads: int, spec_type: str) -> dict:
    llm = LLM(model, max_num_seqs=slots, prompt_cache_mib=cache_mib, threads=threads, spec_type=spec_type)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    firsts = llm.generate([llm.encode_chat([{"role": "user", "content": c[0]}]) for c in chats], params)
    pc = llm.engine.prefix_cache
    store = pc.store
    hits0, store0 = pc.hit_tokens, store.hit_tokens if store else 0
    seconds = [llm.encode_chat([{"role": "user", "content": c[0]}, {"role": "assistant", "content": f.text},
                                {"role": "user", "content": c[1]}]) for c, f in zip(chats, firsts)]
    t0 = time.perf_counter()
    outs = llm.generate(seconds, params)
    wall = time.perf_counter() - t0
    prompt_tokens = sum(len(s) for s in seconds)
    from_store = (store.hit_tokens if store else 0) - store0
    reused = pc.hit_tokens - hits0
    return {"cache_mib": cache_mib, "wall_s": round(wall, 2),
            "ttft_p50_s": round(statistics.median(o.stats["time_to_first_token_s"] for o in outs), 3),
            "prompt_tokens": prompt_tokens, "prefilled": prompt_tokens - reused, "from_slots": reused - from_store,
            "from_store": from_store, "outputs": [o.token_ids for o in outs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--chats", type=int, default=8)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--cache-ram", default="0,2048", help="comma-separated --cache-ram settings (MiB)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec-type", default="none")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    chats = two_turn_chats(a.chats)
    settings = [int(s) for s in a.cache_ram.split(",")]
    ref = None
    for _ in range(a.rounds):
        for mib in settings:
            r = run(a.model, chats, a.slots, mib, a.max_tokens, a.threads, a.spec_type)
            outs = r.pop("outputs")
            ref = ref or outs
            r["outputs_equal_first"] = outs == ref
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
