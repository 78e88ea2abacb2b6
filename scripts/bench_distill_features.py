"""What a head build spends on self-distilled answers' features: the answers generated alone
(train/data.self_distill), the answers generated with their features recorded (train/record.py, what
train-head runs), and extract_shard over the finished answers (what train-head ran before: a second
forward). Arms in turns, ABBA by repetition; the recorded features are checked against the extracted
ones bit for bit.

    python scripts/bench_distill_features.py --prompts 16 --max-tokens 96 --reps 2
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdecode.loader import load_checkpoint, weight_quant  # noqa: E402
from specdecode.models.eagle import default_aux_layers  # noqa: E402
from specdecode.store import resolve_model  # noqa: E402
from specdecode.train.data import extract_shard, self_distill  # noqa: E402
from specdecode.train.prompts import general_prompts  # noqa: E402
from specdecode.train.record import distill_recorded, window  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--quant", default="int4")
    ap.add_argument("--prompts", type=int, default=16, help="general-domain prompts (train/prompts.py), one batch")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cpu = torch.device("cpu")
    model, tok = load_checkpoint(resolve_model(a.model), torch.float32, cpu, weight_quant(a.quant, cpu))
    layers = default_aux_layers(model.cfg.num_layers)
    prompts = general_prompts(a.prompts, 12345)  # not the build's own seed
    n = len(prompts)

    def answer():
        return self_distill(model, tok, prompts, a.max_tokens, n, "float32"), None

    def record():
        return distill_recorded(model, tok, prompts, a.max_tokens, n, "float32", layers, a.seq_len)

    times = {"answer": [], "answer+record": [], "extract": []}
    for rep in range(a.reps):
        order = [("answer", answer), ("answer+record", record)]
        for name, f in (order if rep % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            got, rec = f()
            times[name].append(time.perf_counter() - t0)
            if rec is not None:
                recorded = (got, rec)
        got, rec = recorded
        t0 = time.perf_counter()
        ext = extract_shard(model, [window(g, a.seq_len) for g in got], layers)
        times["extract"].append(time.perf_counter() - t0)
        same = all(torch.equal(rec[k], ext[k]) for k in ("ids", "lens", "argmax", "feats", "final"))
        print(f"rep {rep}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items())
              + f"; {int(rec['lens'].sum())} window tokens; recorded == extracted: {same}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    before, after = med["answer"] + med["extract"], med["answer+record"]
    print(f"medians: answer {med['answer']:.1f} s, answer+record {after:.1f} s, extract {med['extract']:.1f} s; "
          f"answers with their features: {before:.1f} s before, {after:.1f} s now ({before / after:.2f}x less)")


if __name__ == "__main__":
    main()
