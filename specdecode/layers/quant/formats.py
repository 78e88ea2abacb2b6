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


def quantize_int4(w: torch.Tensor, group_size: int, param_dtype: torch.dtype = torch.bfloat16
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [n, in] float32 -> (codes uint8 [n, in] in 0..15, scale, zero float32 [n, in / group_size]).

    The format of the int4 kernels: w ~ (code - 8) * scale + zero per group of group_size inputs, with
    scale and zero stored in param_dtype (bfloat16 for PyTorch's kernel, float16 for the native one).
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
    rounded = scale.to(param_dtype)
    rounded = torch.where(rounded.float() < scale, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))),
                          rounded)
    scale = rounded.float()
    codes = torch.round((g - zero[..., None]) / scale[..., None]).add_(8).clamp_(0, 15).to(torch.uint8)
    return codes.reshape(n, k), scale, zero


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

    codes uint8 [n, in] in 0..15; scale, zero float32 [n, in / group_size]."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

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
        return Int4Rows(fn(self.codes), fn(self.scale), fn(self.zero))

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
