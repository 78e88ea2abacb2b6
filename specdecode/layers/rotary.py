"""Rotary position embedding (NEOX / Hugging Face "rotate_half" layout) with the scaling variants
that Llama-family configs use: linear, dynamic NTK, llama3 and YaRN.

GGUF files of the ``llama`` architecture store q/k rows permuted for llama.cpp's interleaved RoPE;
the GGUF loader undoes that permutation, so every model here uses this one layout."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling as Hugging Face configs spell it. ``kind`` is one of
    none | linear | dynamic | llama3 | yarn; unused fields keep their defaults."""

    kind: str = "none"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None = derived from factor


def _yarn_inv_freq(base: float, dim: int, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2309.00071), as transformers computes it. Returns (inv_freq, attention factor)."""
    orig = s.original_max_position_embeddings
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv_extra, inv_inter = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)

    def correction_dim(num_rot: float) -> float:
        return (dim * math.log(orig / (num_rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra_factor = 1 - ramp
    inv_freq = inv_inter * (1 - extra_factor) + inv_extra * extra_factor
    attn = s.attention_factor if s.attention_factor is not None else (
        0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0)
    return inv_freq, attn


def rope_inv_freq(base: float, dim: int, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """inv_freq [dim/2] (float64) and the attention (cos/sin) scaling factor."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if s.kind in ("none", "default", "dynamic"):
        # dynamic NTK only changes anything past the original context; we keep the base
        # frequencies (what transformers does for sequences within max_position_embeddings).
        return inv_freq, 1.0
    if s.kind == "linear":
        return inv_freq / s.factor, 1.0
    if s.kind == "llama3":
        orig = s.original_max_position_embeddings
        low_wl, high_wl = orig / s.low_freq_factor, orig / s.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wl, inv_freq / s.factor, inv_freq)
        smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        mid = (1 - smooth) * scaled / s.factor + smooth * scaled
        is_mid = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(is_mid, mid, scaled), 1.0
    if s.kind == "yarn":
        return _yarn_inv_freq(base, dim, s)
    raise ValueError(f"unsupported rope scaling {s.kind!r}")


class RotaryEmbedding(nn.Module):
    """Looks up cos/sin by absolute position; the table grows on demand (no max-length allocation)."""

    def __init__(self, head_dim: int, base: float, scaling: RopeScaling):
        super().__init__()
        # A plain attribute, not a buffer: models are built on the meta device and must not lose it.
        with torch.device("cpu"):
            self.inv_freq, self.attn_factor = rope_inv_freq(base, head_dim, scaling)  # float64 [D/2]
        self._cos = self._sin = None

    def _grow(self, n: int, dtype: torch.dtype, device: torch.device) -> None:
        n = max(n, 256, 0 if self._cos is None else 2 * self._cos.shape[0])
        t = torch.arange(n, dtype=torch.float64, device=device)
        freqs = torch.outer(t, self.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)  # [n, D]
        self._cos = (emb.cos() * self.attn_factor).to(dtype)
        self._sin = (emb.sin() * self.attn_factor).to(dtype)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D] (broadcast over heads)."""
        cos, sin = self.tables(int(positions.max()) + 1, dtype, positions.device)
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)

    def tables(self, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [>= n, D], contiguous: row p is what forward gives position p."""
        if self._cos is None or self._cos.shape[0] < n or self._cos.dtype != dtype or self._cos.device != device:
            self._grow(n, dtype, device)
        return self._cos, self._sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by position."""
    return x * cos + _rotate_half(x) * sin
