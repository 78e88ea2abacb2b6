"""Grouped-query self-attention over the paged-by-slot KV cache (see engine/context.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.context import get_context
from .linear import make_linear
from .norm import RMSNorm
from .rotary import apply_rotary


class Attention(nn.Module):
    def __init__(self, layer_id: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 bias: bool, qk_norm: bool, eps: float):
        super().__init__()
        self.layer_id = layer_id
        self.h, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.qkv_proj = make_linear(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias=bias)  # rows [q; k; v]
        self.o_proj = make_linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv_proj(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = q.view(B, T, self.h, self.d)
        k = k.view(B, T, self.hkv, self.d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)  # [B, H, T, D]
        k = apply_rotary(k.transpose(1, 2), cos, sin)  # [B, Hkv, T, D]
        v = v.view(B, T, self.hkv, self.d).transpose(1, 2)
        ctx = get_context()
        keys, values = ctx.kv.update(self.layer_id, k, v, ctx.slots, ctx.starts, ctx.num_new, ctx.total_len)
        q = q.to(keys.dtype)  # attention runs in the cache's type (a bfloat16 cache under float32 weights)
        if ctx.is_causal:  # prefill from an empty cache: the fused causal kernel handles GQA itself
            o = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=self.h != self.hkv)
        elif ctx.row_exact and (B > 1 or T > 1):
            o = self._row_by_row(q, keys, values, ctx)
        else:
            o = self._grouped(q, keys, values, ctx.attn_mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.h * self.d).to(x.dtype))

    def _grouped(self, q, keys, values, mask):
        """GQA by folding each group's query heads into the query axis: q [B, H, T, D] becomes
        [B, Hkv, G*T, D] (row g*T + t), so one plain SDPA call attends the shared keys without
        copying them (torch's enable_gqa path is ~50x slower on CPU for decode shapes)."""
        B, H, T, D = q.shape
        G = H // self.hkv
        if mask is not None and G > 1:
            mask = mask.unsqueeze(2).expand(B, 1, G, T, mask.shape[-1]).reshape(B, 1, G * T, mask.shape[-1])
        o = F.scaled_dot_product_attention(q.reshape(B, self.hkv, G * T, D), keys, values, attn_mask=mask)
        return o.view(B, H, T, D)

    def _row_by_row(self, q, keys, values, ctx):
        """One attention call per query, with exactly the operands a one-token decode of that query
        has (q [1, H, 1, D], its visible keys only, no mask), so the result has the same bits: a
        masked call over more keys, or over several queries, reduces in another order. Padded query
        rows (j >= num_new[b]) stay zero. Costs ~T small calls per layer (verify: T <= ~10)."""
        B, H, T, D = q.shape
        G = H // self.hkv
        qf = q.reshape(B, self.hkv, G, T, D)  # head h = kv head h // G, group member h % G
        rows = []
        for b, row in enumerate(ctx.row_keys()):
            outs = []
            for j, (n, idx) in enumerate(row):
                k, v = (keys[b:b + 1, :, :n], values[b:b + 1, :, :n]) if idx is None else \
                    (keys[b:b + 1, :, idx], values[b:b + 1, :, idx])
                outs.append(F.scaled_dot_product_attention(qf[b:b + 1, :, :, j], k, v))  # [1, Hkv, G, D]
            if len(outs) < T:
                outs += [outs[0].new_zeros(outs[0].shape)] * (T - len(outs))
            rows.append(torch.stack(outs, dim=3))  # [1, Hkv, G, T, D]
        return torch.cat(rows).view(B, H, T, D)
