"""Grouped-query self-attention: projections, q/k norm and RoPE here; how queries meet the KV cache is
the attention backend's (runtime/attention), chosen by the forward context."""
from __future__ import annotations

import torch
from torch import nn

from ..runtime.attention import attention
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
        o = attention(self.layer_id, q, k, v)  # [B, H, T, D]
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.h * self.d).to(x.dtype))
