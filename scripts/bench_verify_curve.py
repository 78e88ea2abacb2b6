"""The 1.5B's whole forward over t = 1, 5, 9 new tokens after a 256-token context (--context), as a verify runs it
(row_exact), rounds interleaving t; prints the medians (first two rounds dropped) and v(t)/v(1). Shorter
than bench_runtime.py's curve, for A/B runs of a code change in turns (one process each). --split also
times each forward without logits (the decoder layers alone; the LM head is the difference); --gemms
also times the decoder's 112 int4 GEMMs alone on as many rows (the model's own weights, one native call
each), so that what the extra rows cost in the GEMMs and around them is told apart:

    python scripts/bench_verify_curve.py --rounds 21; git stash; python scripts/bench_verify_curve.py --rounds 21; git stash pop
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=256, help="tokens in the cache before the new ones")
    ap.add_argument("--split", action="store_true", help="also time the forwards without logits")
    ap.add_argument("--gemms", action="store_true", help="also time the decoder's int4 GEMMs alone")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.config import EngineConfig
    from specdecode.engine.engine import Engine
    from specdecode.kernels import native_kernels

    eng = Engine(EngineConfig(model=a.model, quant="auto", threads=a.threads, max_model_len=max(1024, a.context + 64)))
    runner, kv = eng.runner, eng.kv
    prompt = torch.randint(0, 100000, (a.context,), generator=torch.Generator().manual_seed(0)).tolist()
    slot = kv.allocate()
    runner.forward([slot], [prompt], last_only=True)
    kinds = [(t, lg) for t in (1, 5, 9) for lg in ((True, False) if a.split else (True,))]
    kinds += [(t, "gemms") for t in ((1, 5, 9) if a.gemms else ())]
    linears = [m for layer in eng.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                           layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    if a.gemms and not all(getattr(m, "kernel", None) == "native" and hasattr(m, "qsuper") for m in linears):
        sys.exit("--gemms needs the decoder's linears on the native int4 kernel")
    nk = native_kernels()
    xs = {t: {k: torch.randn(t, k) for k in {m.in_features for m in linears}} for t in (1, 5, 9)}
    times = {k: [] for k in kinds}
    for _ in range(a.rounds):
        for t, lg in kinds:
            kv.set_length(slot, len(prompt))
            t0 = time.perf_counter()
            if lg == "gemms":
                for m in linears:
                    nk.int4_gemm(xs[t][m.in_features], m.qweight, m.qparams, m.qsuper, m.out_features, m.group_size)
            else:
                runner.forward([slot], [prompt[:t]], row_exact=True, logits=lg)
            times[(t, lg)].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[2:]) for k, v in times.items()}
    print(" ".join(f"v({t})={med[(t, True)] * 1e3:.2f}ms" for t in (1, 5, 9)),
          f"v5/v1={med[(5, True)] / med[(1, True)]:.3f} v9/v1={med[(9, True)] / med[(1, True)]:.3f}")
    if a.split:
        print(" ".join(f"layers({t})={med[(t, False)] * 1e3:.2f}ms "
                       f"head({t})={(med[(t, True)] - med[(t, False)]) * 1e3:.2f}ms" for t in (1, 5, 9)),
              f"layers v5/v1={med[(5, False)] / med[(1, False)]:.3f}")
    if a.gemms:
        print(" ".join(f"gemms({t})={med[(t, 'gemms')] * 1e3:.2f}ms" for t in (1, 5, 9)),
              f"gemms 5-1={(med[(5, 'gemms')] - med[(1, 'gemms')]) * 1e3:.2f}ms "
              f"9-1={(med[(9, 'gemms')] - med[(1, 'gemms')]) * 1e3:.2f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
