"""4-bit weights with a scale and a zero per group of inputs (``--quant int4``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import TILE, int4_scale_buffers, pack_int4, store_int4_scales
from .base import QuantFormat, QuantLinear, _compute_dtype, _kernel_input, _native_kernels
from .formats import Int4Rows, pack_nibbles, quantize_int4, quantize_int4_super, super_groups, unpack_nibbles

GROUP = 32  # GGUF Q4_K sub-block size: 4x finer scales than 128, for ~5-12% more time per GEMV (measured)


class Int4Linear(QuantLinear):
    """4-bit codes with scales per group of ``group_size`` inputs, in one of three packings:

    - ``native`` (specdecode/kernels/quant_gemm.c, the default where it builds): qweight uint8
      [out, in / 2] in 16-row tiles; 8-bit sub-scales under float16 super-scales (quantize_int4_super,
      4.625 bits per weight in all): qparams uint8 [out / 16, G, 2, 16] and qsuper int16
      [out / 16, G / S, 2, 16] (store_int4_scales). Activations are quantized to int8 per group inside
      the kernel.
    - ``torch`` (PyTorch's tinygemm kernels: ``_weight_int4pack_mm_for_cpu`` on CPU,
      ``_weight_int4pack_mm`` on CUDA): qweight uint8 [out, in / 2] holding the tinygemm layout (on
      CUDA the int32 [out / 8, in / (16 t), 32, t / 2] tensor of ``_convert_weight_to_int4pack``,
      t = inner k tiles, as bytes: each block of 8 rows is contiguous), qparams int16
      [in / group_size, out, 2] (bf16 bits of scale, zero); activations are cast to bfloat16.
    - ``dequant`` (any device): qweight = pack_nibbles(codes), qparams as ``torch``.

    Scales are kept in integer dtypes so that module.to(dtype) leaves them alone. The native and torch
    packings depend on the machine: pack where it runs, never ship a state_dict of them.
    """
    kind = "int4"

    def __init__(self, in_features: int, out_features: int, bias: bool = False, group_size: int = 128,
                 kernel: str = "auto"):
        super().__init__(in_features, out_features, bias)
        if group_size not in (32, 64, 128, 256) or in_features % group_size or out_features % 16:
            raise ValueError(f"Int4Linear needs group_size in 32/64/128/256 dividing in_features and "
                             f"out_features % 16 == 0, got in={in_features} out={out_features} group={group_size}")
        native = _native_kernels(kernel)
        self.group_size = group_size
        self._use_kernel(native, kernel)
        # Rows packed together: native 16-row tiles; tinygemm interleaves blocks of 64 (CPU AVX512),
        # 32 (CPU AVX2) or 8 (CUDA) rows; nibble pairs are row-local.
        self._pack_rows = {"native": TILE, "torch": 64, "dequant": 1}[self._mode]
        groups = in_features // group_size
        self.register_buffer("qweight", torch.empty(out_features, in_features // 2, dtype=torch.uint8))
        if native is not None:
            sub, sup = int4_scale_buffers(out_features, groups, groups // super_groups(groups))
            self.register_buffer("qparams", sub)
            self.register_buffer("qsuper", sup)
        else:
            self.register_buffer("qparams", torch.empty(groups, out_features, 2, dtype=torch.int16))
            self.qsuper = None

    @classmethod
    def check_layer(cls, kernel: str) -> "Int4Linear":
        return cls(256, 64, group_size=32, kernel=kernel)

    def _weight_device(self) -> torch.device:
        dev = self.qweight.device
        if self._mode == "native" and dev.type != "cpu":
            raise NotImplementedError("the native int4 kernel runs on CPU only")
        if self._mode == "torch":
            op = {"cpu": "_weight_int4pack_mm_for_cpu", "cuda": "_weight_int4pack_mm"}.get(dev.type)
            if op is None or not hasattr(torch.ops.aten, op):
                raise NotImplementedError(f"torch {torch.__version__} has no int4 kernel for {dev.type}: "
                                          f"use kernel='dequant'")
        return dev

    def takes_int4(self, rows: Int4Rows) -> bool:
        return rows.group_size == self.group_size

    def _load_step(self, start: int, w: torch.Tensor | Int4Rows) -> None:
        if self._native is not None:
            G = self.in_features // self.group_size
            if isinstance(w, Int4Rows) and w.blocks is not None and w.blocks[0].shape[1] * super_groups(G) == G:
                codes, (d, sc, dm, m) = w.codes, w.blocks  # Q4_K: the same format, stored as it is
            else:
                codes, d, sc, dm, m = quantize_int4_super(w.dense() if isinstance(w, Int4Rows) else w,
                                                          self.group_size)
            store_int4_scales(self.qparams, self.qsuper, start, d, sc, dm, m)
            self._write_codes(start, codes)
            return
        if isinstance(w, Int4Rows):
            codes, scale, zero = w.codes, w.scale, w.zero
            if not (torch.isfinite(scale.to(torch.bfloat16)).all() and torch.isfinite(zero.to(torch.bfloat16)).all()):
                raise ValueError("int4 rows: scales beyond the bfloat16 range of the format")
        else:
            codes, scale, zero = quantize_int4(w, self.group_size, torch.bfloat16)
        self.qparams[:, start:start + len(w)] = torch.stack([scale, zero], -1).to(torch.bfloat16) \
            .view(torch.int16).transpose(0, 1)
        self._write_codes(start, codes)

    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        if self._mode == "native":
            return pack_int4(codes, self.group_size)
        if self._mode == "dequant":
            return pack_nibbles(codes)
        if self.qweight.is_cuda:  # (a stashed partial block's codes may sit on the CPU)
            # tinygemm on CUDA takes two codes per byte, the even k in the high nibble
            c = codes.to(self.qweight.device, torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack((c[:, 0::2] << 4 | c[:, 1::2]).contiguous(),
                                                                _inner_k_tiles(self.in_features))
            return packed.contiguous().view(torch.uint8).reshape(len(codes), -1)
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """-> [out, in] in dtype, the weight of the dequant packing (the others keep no plain codes)."""
        if self._mode != "dequant":
            raise NotImplementedError("dequantize() reads the dequant packing only")
        sz = self.qparams.view(torch.bfloat16).to(dtype)  # [groups, out, 2]
        g = unpack_nibbles(self.qweight).to(dtype).view(self.out_features, -1, self.group_size).sub_(8)
        return (g * sz[..., 0].t()[..., None] + sz[..., 1].t()[..., None]).view(self.out_features, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight
        x2d = x.reshape(-1, self.in_features)
        if self._mode == "native":
            if not w.is_cpu:
                self._weight_device()  # raises
            y = self._native.int4_gemm(x2d.float().contiguous(), w, self.qparams, self.qsuper, self.out_features,
                                       self.group_size)
        elif self._mode == "dequant":
            dt = _compute_dtype(x)
            y = F.linear(x2d.to(dt), self.dequantize(dt))
        else:
            y = int4_mm(_kernel_input(x2d, torch.bfloat16), w, self.group_size, self.qparams.view(torch.bfloat16))
        return self._finish(y, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, group_size={self.group_size}, kernel={self.kernel}"


def _inner_k_tiles(in_features: int) -> int:
    """tinygemm's CUDA packing: the largest inner k tiles (8, 4, 2) with in_features % (16 t) == 0."""
    return next(t for t in (8, 4, 2) if in_features % (16 * t) == 0)


def int4_mm(x: torch.Tensor, qweight: torch.Tensor, group_size: int, sz: torch.Tensor) -> torch.Tensor:
    """PyTorch's tinygemm int4 matmul: x bf16 [M, in], the torch packing of Int4Linear, sz bf16
    [in / group_size, out, 2] -> bf16 [M, out]."""
    if qweight.is_cuda:
        n, k = qweight.shape[0], 2 * qweight.shape[1]
        t = _inner_k_tiles(k)
        w = qweight.view(torch.int32).reshape(n // 8, k // (16 * t), 32, t // 2)
        return torch.ops.aten._weight_int4pack_mm(x, w, group_size, sz)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, qweight, group_size, sz)


def _make(linear: nn.Linear, kernel: str) -> nn.Module | None:
    if linear.in_features % GROUP or linear.out_features % 16:
        return None
    return Int4Linear(linear.in_features, linear.out_features, linear.bias is not None, group_size=GROUP, kernel=kernel)


# 4-bit codes plus 8-bit sub-scales per 32 inputs under 16-bit super-scales per 256: 4.625 bits per
# weight natively (PyTorch's kernels: a 16-bit scale and zero per 32, 5.0).
FORMAT = QuantFormat("int4", 4.625, Int4Linear, _make, fallback="int8")
