"""The first backend: PyTorch's scaled_dot_product_attention over the slot KV cache (CPU and any
device torch supports)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..context import Context
from .base import AttentionBackend


class TorchSDPABackend(AttentionBackend):
    name = "torch-sdpa"

    def forward(self, layer, q, k, v, ctx: Context):
        B, H, T, D = q.shape
        keys, values = ctx.kv.update(layer, k, v, ctx.slots, ctx.starts, ctx.num_new, ctx.total_len)
        q = q.to(keys.dtype)  # attention runs in the cache's type (a bfloat16 cache under float32 weights)
        if ctx.is_causal:  # prefill from an empty cache: the fused causal kernel handles GQA itself
            return F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=H != keys.shape[1])
        if ctx.row_exact and (B > 1 or T > 1):
            return self._row_by_row(q, keys, values, ctx)
        return self.attend(q, keys, values, ctx.attn_mask)

    def attend(self, q, k, v, mask=None, causal=False):
        """GQA by folding each group's query heads into the query axis: q [B, H, T, D] becomes
        [B, Hkv, G*T, D] (row g*T + t), so one plain SDPA call attends the shared keys without
        copying them (torch's enable_gqa path is ~50x slower on CPU for decode shapes)."""
        B, H, T, D = q.shape
        hkv, L = k.shape[1], k.shape[2]
        G = H // hkv
        if causal:
            mask = torch.ones(T, L, dtype=torch.bool, device=q.device).tril(L - T)[None, None]
        if mask is not None and G > 1:
            mask = mask.unsqueeze(2).expand(mask.shape[0], 1, G, T, L).reshape(mask.shape[0], 1, G * T, L)
        o = F.scaled_dot_product_attention(q.reshape(B, hkv, G * T, D), k, v, attn_mask=mask)
        return o.view(B, H, T, D)

    @staticmethod
    def _row_by_row(q, keys, values, ctx: Context):
        """One attention call per query, with exactly the operands a one-token decode of that query
        has (q [1, H, 1, D], its visible keys only, no mask), so the result has the same bits: a
        masked call over more keys, or over several queries, reduces in another order. Padded query
        rows (j >= num_new[b]) stay zero. Costs ~T small calls per layer (verify: T <= ~10)."""
        B, H, T, D = q.shape
        hkv = keys.shape[1]
        qf = q.reshape(B, hkv, H // hkv, T, D)  # head h = kv head h // G, group member h % G
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
