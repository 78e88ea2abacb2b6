"""The attention backend contract. A backend owns how queries meet keys; the layers above it only
project, rotate and call ``attention`` (runtime/attention/__init__.py)."""
from __future__ import annotations

import torch

from ..context import Context


class AttentionBackend:
    """Contract:
    - ``forward(layer, q, k, v, ctx)``: q [B, H, T, D], k, v [B, Hkv, T, D] (new tokens, rotated).
      Writes k, v into ``ctx.kv`` (layer ``layer``) at each row's start, then returns o [B, H, T, D]
      where query t of row b attends the keys ``ctx`` allows: the committed prefix and the new tokens
      its tree mask allows (``ctx.attn_mask`` when set, else causal). Output rows of padded queries
      (t >= num_new[b]) are finite and otherwise unspecified. With ``ctx.row_exact``, each real query
      must get exactly the bits a one-token decode of it would get (greedy speculative output equals
      plain greedy output).
    - ``attend(q, k, v, mask=None, causal=False)``: the same attention over explicit operands
      (training and reference paths): k, v [B, Hkv, L, D]; mask [B or 1, 1, T, L] bool (True =
      attend) or None (every key, or causal when ``causal``).
    GQA: H is a multiple of Hkv; query head h reads kv head h // (H / Hkv)."""

    name = "base"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: Context) -> torch.Tensor:
        raise NotImplementedError

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
               causal: bool = False) -> torch.Tensor:
        raise NotImplementedError
