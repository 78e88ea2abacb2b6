"""int8 weights, one scale per output row (``--quant int8``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import INT8_GROUP, TILE, pack_int8, unpack_int8
from .base import QuantFormat, QuantLinear, _compute_dtype, _kernel_input, _native_kernels
from .formats import quantize_int8


class Int8Linear(QuantLinear):
    """int8 codes q [out, in] with one float32 scale per output row (``scales`` [out]), in one of two
    packings:

    - ``native`` (specdecode/kernels/quant_gemm.c, where it builds and out % 16 == 0, in % 32 == 0):
      qweight uint8 [out, in] holding q + 128 in 16-row tiles; activations quantized to int8 per
      group of 32 inside the kernel.
    - ``torch`` (PyTorch's ``_weight_int8pack_mm``, CPU and CUDA) and ``dequant`` (any device):
      qweight int8 [out, in] plain.
    Weight bytes: out * in (+ 4 * out).
    """
    kind = "int8"

    def __init__(self, in_features: int, out_features: int, bias: bool = False, kernel: str = "auto"):
        super().__init__(in_features, out_features, bias)
        if in_features % 16:
            raise ValueError(f"Int8Linear needs in_features % 16 == 0 (the CPU kernel steps K by 16), "
                             f"got {in_features}")
        native = _native_kernels(kernel)
        if native is not None and (out_features % TILE or in_features % INT8_GROUP):
            if kernel == "native":
                raise ValueError(f"the native int8 kernel needs out % {TILE} == 0 and in % {INT8_GROUP} == 0, "
                                 f"got in={in_features} out={out_features}")
            native = None
        self._use_kernel(native, kernel)
        self._pack_rows = TILE if native is not None else 1
        self.register_buffer("qweight", torch.empty(out_features, in_features,
                                                    dtype=torch.uint8 if native is not None else torch.int8))
        self.register_buffer("scales", torch.empty(out_features))
        self._unit: torch.Tensor | None = None

    @classmethod
    def check_layer(cls, kernel: str) -> "Int8Linear":
        return cls(256, 64, kernel=kernel)

    def _weight_device(self) -> torch.device:
        if self._native is not None and self.qweight.device.type != "cpu":
            raise NotImplementedError("the native int8 packing runs on CPU only")
        return self.qweight.device

    def _load_step(self, start: int, w: torch.Tensor) -> None:
        q, scale = quantize_int8(w)
        self.scales[start:start + len(w)] = scale
        self._write_codes(start, q)

    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        return pack_int8(codes) if self._native is not None else codes

    def int8_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """q int8 [out, in], or only rows ids (int64) -> [len(ids), in] (a tied embedding's lookup)."""
        if self._native is not None:
            return unpack_int8(self.qweight, ids)
        return self.qweight if ids is None else self.qweight[ids]

    def dequantize(self) -> torch.Tensor:
        """-> float32 [out, in], the weight this layer multiplies by."""
        return self.int8_rows().float() * self.scales.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.qweight
        x2d = x.reshape(-1, self.in_features)
        if self._native is not None:
            return self._finish(self._native.int8_gemm(x2d.float().contiguous(), w, self.scales, self.out_features), x)
        if self._mode == "dequant":
            dt = _compute_dtype(x)
            return self._finish(F.linear(x2d.to(dt), w.to(dt)) * self.scales.to(dt), x)
        xc = _kernel_input(x2d, torch.bfloat16) if w.is_cpu else x2d.float().contiguous()
        # The kernel gets unit scales and the float32 scales are applied to its [M, out] result: the
        # bf16 result must be widened anyway, and this keeps the scales out of bf16.
        unit = self._unit
        if unit is None or unit.device != w.device or unit.dtype != xc.dtype:
            unit = self._unit = torch.ones(self.out_features, dtype=xc.dtype, device=w.device)
        return self._finish(torch.ops.aten._weight_int8pack_mm(xc, w, unit) * self.scales, x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel}"


def _make(linear: nn.Linear, kernel: str) -> nn.Module | None:
    if linear.in_features % 16:
        return None
    return Int8Linear(linear.in_features, linear.out_features, linear.bias is not None, kernel=kernel)


FORMAT = QuantFormat("int8", 8.0, Int8Linear, _make)
