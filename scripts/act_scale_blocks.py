"""What one int8 activation scale per block of B inputs costs in agreement with float32: the question
behind integer sub-scales. The int4 kernel quantizes activations per group of 32 (one scale each), so
every group's dot product leaves the integers for a float epilogue; summing a Q4_K super-block's 8
groups in integers (as llama.cpp's Q8_K does) needs one activation scale per 256 inputs.

Emulated on the float32 model: every linear layer but the LM head sees its input rounded to int8 with one
scale (max |x| / 127) per block of B consecutive inputs, the weights stay float32, so the figures
isolate the activation rounding. Teacher-forced over the head of the standard library's `textwrap.py`
(as scripts/quant_agreement.py), top-1 agreement and mean KL(float32 || emulated):

    python scripts/act_scale_blocks.py --tokens 512 --blocks 32,64,128,256
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_agreement import agreement, passage_ids, teacher_forced  # noqa: E402  (scripts/ is sys.path[0])


def rounded(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [..., K] with each run of ``block`` inputs rounded to int8 under its own scale (0 for all-zero)."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    sx = xb.abs().amax(-1, keepdim=True) / 127
    q = torch.where(sx > 0, torch.round(xb / sx.clamp(min=torch.finfo(x.dtype).tiny)), torch.zeros_like(xb))
    return (q * sx).reshape(x.shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--blocks", default="32,64,128,256")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from specdecode.loader import load_checkpoint
    from specdecode.store import resolve_model

    path = resolve_model(a.model)
    ids = passage_ids(path, a.tokens)
    model, _ = load_checkpoint(path, torch.float32, "cpu", "none")
    block = {"B": 0}

    def linear(self, x):
        return F.linear(rounded(x, block["B"]) if block["B"] else x, self.weight, self.bias)

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and "lm_head" not in name:
            m.forward = linear.__get__(m)

    with torch.inference_mode():
        ref = teacher_forced(model, ids)
        for b in (int(s) for s in a.blocks.split(",")):
            block["B"] = b
            agree, kl = agreement(ref, teacher_forced(model, ids))
            print(json.dumps({"model": a.model, "block": b, "tokens": len(ids), "top1_agreement": round(agree, 4),
                              "mean_kl": round(kl, 5)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
