"""Shared against per-sequence draft lengths (choose_ragged_draft_lengths) on a mixed batch of 8, `auto`,
greedy, 96 tokens: 4 requests whose answers the suffix cache already holds (asked once before) beside 4
fresh ones (their prompts prefilled alike beforehand). A fresh LLM per run, modes alternated.

    python scripts/ab_ragged_draft_lengths.py 4      # runs per mode
"""
import json
import statistics
import sys
import time
import specdecode.engine.engine as E
from specdecode import LLM, SamplingParams
from specdecode.speculative.controller import choose_batch_draft_length
qs = [json.loads(l) for l in open(__import__("pathlib").Path(__file__).resolve().parents[2] / "shared/datasets/spec_bench/question.jsonl")]
ragged = E.choose_ragged_draft_lengths
def shared(alphas, draft_cost, rows_cost, caps, k_min=0, depth=lambda k: k):
    B = len(alphas)
    k = choose_batch_draft_length(alphas, draft_cost, lambda t: rows_cost(B * t), max(caps), k_min, depth)
    return [min(k, c) for c in caps]
res = {"shared": [], "ragged": []}
for rep in range(int(sys.argv[1])):
    for mode in (("shared", "ragged") if rep % 2 == 0 else ("ragged", "shared")):
        E.choose_ragged_draft_lengths = shared if mode == "shared" else ragged
        llm = LLM("qwen2.5-coder-1.5b-instruct", spec_type="auto", threads=2, max_num_seqs=8)
        enc = lambda i: llm.encode_chat([{"role": "user", "content": qs[i]["turns"][0]}])
        p = SamplingParams(temperature=0, max_tokens=96)
        llm.generate([enc(i) for i in (10, 30, 50, 70)], p)  # their answers enter the suffix cache
        batch = [enc(i) for i in (10, 30, 50, 70, 90, 110, 130, 150)]
        llm.generate([enc(i) for i in (90, 110, 130, 150)], SamplingParams(temperature=0, max_tokens=1))  # prompts prefilled alike
        t0 = time.perf_counter(); outs = llm.generate(batch, p); wall = time.perf_counter() - t0
        n = sum(len(o.token_ids) for o in outs)
        res[mode].append(n / wall)
        print(mode, round(n / wall, 1), "tok/s", flush=True)
print({m: (round(statistics.median(v), 1), [round(x, 1) for x in v]) for m, v in res.items()})
