"""Weight quantization formats as pure functions: the quantized layers (layers/quant.py) store their
results, the tests check them against their error bounds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, in] float32 -> (q int8 [n, in], scale float32 [n]), symmetric per row: w ~ q * scale.

    q spans [-127, 127] with scale = max|w_row| / 127, so nothing is clipped and |w - q*scale| <= scale/2.
    """
    scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _round_up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x float32 -> the smallest value of dtype >= x, as float32: a scale rounded up never clips."""
    r = x.to(dtype)
    return torch.where(r.float() < x, torch.nextafter(r, torch.full_like(r, float("inf"))), r).float()


def quantize_int4(w: torch.Tensor, group_size: int, param_dtype: torch.dtype = torch.bfloat16
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [n, in] float32 -> (codes uint8 [n, in] in 0..15, scale, zero float32 [n, in / group_size]).

    The format of PyTorch's int4 kernels (``torch``, ``dequant``; the native kernel's is
    quantize_int4_super): w ~ (code - 8) * scale + zero per group of group_size inputs, with scale and
    zero stored in param_dtype (bfloat16 for PyTorch's kernel).
    Both are rounded to param_dtype *before* the codes are chosen, and scale is widened to cover the
    group around the rounded zero, so |w - dequant| <= scale/2 holds for the stored values (the bound
    a plain min/max grid would lose to the rounding of zero).
    """
    n, k = w.shape
    g = w.reshape(n, k // group_size, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    zero = (lo + (hi - lo) * (8 / 15)).to(param_dtype).float()
    if not torch.isfinite(zero).all():
        raise ValueError(f"int4 quantization: weights beyond the {param_dtype} range of the format")
    scale = torch.maximum((hi - zero) / 7, (zero - lo) / 8).clamp(min=1e-30)
    scale = _round_up(scale, param_dtype)
    codes = torch.round((g - zero[..., None]) / scale[..., None]).add_(8).clamp_(0, 15).to(torch.uint8)
    return codes.reshape(n, k), scale, zero


def super_groups(groups: int) -> int:
    """Groups of a super-block in the native int4 format: the largest divisor of ``groups`` up to 8
    (quant_gemm.c's super_groups; 8 whenever in_features % 256 == 0 at groups of 32, as in Q4_K)."""
    return next(s for s in range(8, 0, -1) if groups % s == 0)


def _half_up(x: torch.Tensor) -> torch.Tensor:
    """_round_up to float16, raising where the format cannot hold the result."""
    h = _round_up(x, torch.float16)
    if not torch.isfinite(h).all():
        raise ValueError("int4 quantization: weights beyond the float16 range of the format")
    return h


def quantize_int4_super(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, ...]:
    """w [n, in] float32 -> (codes uint8 [n, in] in 0..15, d float32 [n, B], sc uint8 [n, G],
    dm float32 [n, B], m int8 [n, G]) with G = in / group_size groups in B = G / S super-blocks
    (S = super_groups(G)): the native kernel's format w ~ code * d * sc + dm * m (quant_gemm.c).

    Per group, the minimum rounds *down* to the grid of dm = max |min| / 127 of its super-block, then
    the step that reaches the group's maximum from there rounds *up* to the grid of d = max step / 255,
    both d and dm rounded up to float16 first: the 16 levels cover the group, and |w - dequant| <=
    d sc / 2 <= (hi - lo + dm) / 30 + d / 2 holds for the stored values."""
    n, k = w.shape
    G = k // group_size
    S = super_groups(G)
    g = w.reshape(n, G, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)  # [n, G]
    dm = _half_up(lo.abs().reshape(n, G // S, S).amax(-1) / 127)  # [n, B]
    dm_g = dm.repeat_interleave(S, 1)
    m = torch.where(dm_g > 0, torch.floor(lo / dm_g.clamp(min=1e-30)), torch.zeros_like(lo)).clamp_(-127, 127)
    base = m * dm_g  # the group's lowest level, <= lo
    step = (hi - base) / 15
    d = _half_up(step.reshape(n, G // S, S).amax(-1) / 255).clamp(min=2.0 ** -24)  # [n, B]
    d_g = d.repeat_interleave(S, 1)
    sc = torch.ceil(step / d_g).clamp_(0, 255)
    scale = (d_g * sc).clamp(min=1e-30)
    codes = torch.round((g - base[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    return codes.reshape(n, k), d, sc.to(torch.uint8), dm, m.to(torch.int8)


def dequantize_int4_super(codes: torch.Tensor, d: torch.Tensor, sc: torch.Tensor, dm: torch.Tensor,
                          m: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_int4_super: -> float32 [n, in]."""
    n, k = codes.shape
    G = sc.shape[1]
    S = G // d.shape[1]
    scale = d.repeat_interleave(S, 1) * sc.float()
    base = dm.repeat_interleave(S, 1) * m.float()
    return (codes.reshape(n, G, -1).float() * scale[..., None] + base[..., None]).reshape(n, k)


def dequantize_int4(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize_int4: -> float32 [n, in]."""
    n, k = codes.shape
    g = codes.reshape(n, scale.shape[1], -1).float().sub_(8)
    return (g * scale[..., None] + zero[..., None]).reshape(n, k)


@dataclass(frozen=True)
class Int4Rows:
    """Rows of a weight that a checkpoint already stores in the int4 format, w = (codes - 8) * scale +
    zero per group of inputs (GGUF's Q4_0, Q4_1 and Q4_K sub-blocks of 32 are exactly this). Loading
    them as they are keeps the file's own rounding: dequantizing and quantizing again with
    quantize_int4's min/max grid would add a second rounding as large as the first.

    codes uint8 [n, in] in 0..15; scale, zero float32 [n, in / group_size]. ``blocks``: for Q4_K, the
    same weights in quantize_int4_super's terms (d [n, G / 8], sc uint8 [n, G], dm [n, G / 8], m int8
    [n, G]; scale = d sc, zero = 8 d sc + dm m), which the native format stores as they are."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    blocks: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def group_size(self) -> int:
        return self.codes.shape[1] // self.scale.shape[1]

    def dim(self) -> int:
        return 2

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Int4Rows":
        """fn applied to the rows of all three tensors alike (a slice, a permutation, a device move)."""
        return Int4Rows(fn(self.codes), fn(self.scale), fn(self.zero),
                        None if self.blocks is None else tuple(fn(t) for t in self.blocks))

    def __getitem__(self, rows: slice) -> "Int4Rows":
        return self.map_rows(lambda t: t[rows])

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """-> [n, in] in dtype, the weight these rows stand for."""
        return dequantize_int4(self.codes, self.scale, self.zero).to(dtype)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """codes [n, k] in 0..15 -> uint8 [n, k / 2]: byte j holds code 2j (low nibble) and 2j+1 (high)."""
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: uint8 [n, k / 2] -> uint8 [n, k]."""
    return torch.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
