"""Numerical check of the quantized path against float32 on the same GGUF: top-1 agreement and mean
KL(float32 || quantized) of next-token distributions over a text passage (teacher forcing).

    python scripts/quant_agreement.py --model qwen2.5-coder-1.5b-instruct --quant auto --tokens 512

The passage is the head of the standard library's `textwrap.py` (code + English docstrings)."""
from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

import torch


def passage_ids(path, tokens: int) -> list[int]:
    """The first ``tokens`` token ids of the standard library's textwrap.py (code + English docstrings)."""
    from specdecode.tokenizer import Tokenizer

    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
    return Tokenizer.from_gguf(path).encode(text, add_special_tokens=False)[:tokens]


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """The model's next-token logits [len(ids), V] at every position of ids, one forward."""
    from specdecode.runtime.kv_cache import KVCache
    from specdecode.runtime.model_runner import ModelRunner

    c = model.cfg
    runner = ModelRunner(model, KVCache(c.num_layers, 1, len(ids) + 8, c.num_kv_heads, c.head_dim, torch.float32))
    logits, _, _ = runner.forward([runner.kv.allocate()], [ids])
    return logits[0]


def agreement(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(top-1 agreement, mean KL(ref || got)) of two [T, V] logit tensors."""
    agree = (ref.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="batchmean").item()
    return agree, kl


def logits_for(path, quant, ids, threads):
    from specdecode.loader import load_checkpoint

    model, tok = load_checkpoint(path, torch.float32, "cpu", quant)
    return teacher_forced(model, ids), model.quant, tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.store import resolve_model

    path = resolve_model(a.model)
    ids = passage_ids(path, a.tokens)
    ref, _, _ = logits_for(path, "none", ids, a.threads)
    got, quant, _ = logits_for(path, a.quant, ids, a.threads)
    agree, kl = agreement(ref, got)
    print(json.dumps({"model": a.model, "quant": quant, "tokens": len(ids), "top1_agreement": round(agree, 4),
                      "mean_kl": round(kl, 5)}))


if __name__ == "__main__":
    main()
