"""Weight-only quantized linear layers: ``Int8Linear`` (int8, one scale per output row) and
``Int4Linear`` (4-bit, a scale and a zero per group of ``group_size`` inputs).

Both are drop-in for ``nn.Linear`` (``forward(x [..., in]) -> [..., out]`` in x's dtype, optional
float ``bias`` parameter) and are filled either whole (``from_float``) or shard by shard
(``load_rows(offset, rows)``: the loader writes q/k/v or gate/up row ranges of one packed layer one
at a time), quantizing each shard as it arrives so that no float copy of the layer is ever held.

Kernels (``kernel=auto|native|torch``): ``native`` is specdecode/kernels/quant_gemm.c, built for this
CPU on first use (AVX2 or AVX512-VNNI): activations are quantized to int8 per group of 32 and meet
the codes in integer dot products; each output row depends on its input row only, so a token's
result does not depend on how many tokens share the call. ``auto`` takes it wherever it builds.
``torch`` is PyTorch's weight-only CPU kernels, vectorized for bfloat16 activations only (float32
takes a scalar loop 15-30x slower), so forward casts x to bfloat16 there; its int8 kernel also
loads with *aligned* 16/32-byte loads (forward re-allocates a misaligned x) and needs
in_features % 16 == 0 (checked).

``dequant`` runs on any device: plain codes, dequantized to x's dtype on each call and multiplied by
``F.linear`` (correct everywhere, slower than a fused kernel).

Devices: on CUDA, ``torch`` is PyTorch's ``_weight_int4pack_mm`` (tinygemm packing, bfloat16
activations) and ``_weight_int8pack_mm``. This work had no GPU to test them on, so
``layers/quant_device.py`` checks each against ``dequant`` once per device before the model builder
uses it, and takes ``dequant`` where the check fails.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import INT8_GROUP, TILE, native_kernels, pack_int4, pack_int8, unpack_int8
from .quant_formats import dequantize_int4, pack_nibbles, quantize_int4, quantize_int8, unpack_nibbles  # noqa: F401

# Rows quantized per step of load_rows: bounds the float32 temporaries (~4M elements, 16 MB) when a
# shard is large (LM head: 151936 rows). A multiple of 64 so that steps align with int4 pack blocks.
_STEP_ELEMENTS = 1 << 22


def _kernel_input(x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [M, in] -> contiguous [M, in] in dtype whose data starts on a 64-byte boundary."""
    xc = x2d.to(dtype).contiguous()
    return xc if xc.data_ptr() % 64 == 0 else xc.clone()


class _QuantLinear(nn.Module):
    """Shared shape bookkeeping, bias and shard loading; subclasses quantize rows in ``_load_step``."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # Float bias kept as a parameter so that the loader copies it like nn.Linear's.
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        # Rows packed together: a row range starting and ending on multiples of _pack_rows (or at
        # out) packs on its own; other ranges wait in _pending until their block is complete.
        self._pack_rows = 1
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block start -> (codes, rows filled)
        self._native = None  # the native kernels (specdecode/kernels) when this layer uses them
        self._mode = "torch"  # native | torch | dequant

    def _use_kernel(self, native, kernel: str) -> None:
        """native: the built kernels, or None (not asked for, or this shape does not fit them)."""
        self._native = native
        self._mode = "native" if native is not None else ("dequant" if kernel == "dequant" else "torch")

    @property
    def kernel(self) -> str:
        return self._mode

    @property
    def pending_rows(self) -> int:
        """Rows quantized but not yet packed, waiting for the rest of their pack block."""
        return sum(int(filled.sum()) for _, filled in self._pending.values())

    def _pack(self, codes: torch.Tensor) -> torch.Tensor:
        """codes of whole pack blocks -> the rows of qweight they fill."""
        return codes

    def _write_codes(self, start: int, codes: torch.Tensor) -> None:
        """Packs codes [n, ...] of rows [start, start + n) into qweight, stashing partial blocks."""
        end, rows = start + len(codes), self._pack_rows
        a = min(-(-start // rows) * rows, end)
        b = end if end == self.out_features else max(a, end // rows * rows)
        if a < b:
            self.qweight[a:b] = self._pack(codes[a - start:b - start])
        for lo, hi in ((start, a), (b, end)):
            if lo < hi:
                self._stash(lo, codes[lo - start:hi - start])

    def _stash(self, start: int, codes: torch.Tensor) -> None:
        rows = self._pack_rows
        block = start // rows * rows
        size = min(rows, self.out_features - block)
        buf, filled = self._pending.setdefault(
            block, (torch.zeros((size,) + codes.shape[1:], dtype=codes.dtype, device=codes.device),
                    torch.zeros(size, dtype=torch.bool)))
        buf[start - block:start - block + len(codes)] = codes
        filled[start - block:start - block + len(codes)] = True
        if filled.all():
            self.qweight[block:block + size] = self._pack(buf)
            del self._pending[block]

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, **kwargs) -> "_QuantLinear":
        """weight [out, in] float (any float dtype), bias [out] or None."""
        out_features, in_features = weight.shape
        if weight.device.type != "cpu":  # the native kernels are CPU code
            from .quant_device import device_kernel

            kwargs.setdefault("kernel", device_kernel(cls.kind, str(weight.device)))
        layer = cls(in_features, out_features, bias is not None, **kwargs).to(weight.device)
        layer.load_rows(0, weight)
        if bias is not None:
            with torch.no_grad():
                layer.bias.copy_(bias)
        return layer

    @torch.no_grad()
    def load_rows(self, offset: int, rows: torch.Tensor) -> None:
        """Quantizes rows [n, in] of the float weight into output rows [offset, offset + n)."""
        n = rows.shape[0]
        if rows.dim() != 2 or rows.shape[1] != self.in_features or offset < 0 or offset + n > self.out_features:
            raise ValueError(f"rows {tuple(rows.shape)} at offset {offset} do not fit a "
                             f"[{self.out_features}, {self.in_features}] weight")
        step = max(64, _STEP_ELEMENTS // self.in_features // 64 * 64)
        start = offset
        while start < offset + n:
            end = min(offset + n, (start // step + 1) * step)  # absolute boundaries: multiples of 64
            self._load_step(start, rows[start - offset:end - offset].to(self._weight_device(), torch.float32))
            start = end

    def _weight_device(self) -> torch.device:
        """The device of the quantized weight; raises where the format has no kernel."""
        raise NotImplementedError

    def _load_step(self, start: int, w: torch.Tensor) -> None:
        raise NotImplementedError

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y [M, out] -> [..., out] in x's dtype, plus bias (the float32 bias promotes a bf16 y)."""
        bias = self.bias
        if bias is not None:
            y = y + bias
        return y.to(x.dtype).view(x.shape[:-1] + (self.out_features,))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# -- layers ------------------------------------------------------------------------------------------

class Int8Linear(_QuantLinear):
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


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dequant kernel's dtype: x's own for 16/32-bit floats (one dequantized weight per call)."""
    return x.dtype if x.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32


def _native_kernels(kernel: str):
    """The native kernels for kernel = auto | native | torch | dequant (None: not native)."""
    if kernel not in ("auto", "native", "torch", "dequant"):
        raise ValueError(f"unknown kernel {kernel!r} (auto, native, torch, dequant)")
    native = native_kernels() if kernel in ("auto", "native") else None
    if kernel == "native" and native is None:
        raise RuntimeError("the native kernels cannot be built on this machine")
    return native


class Int4Linear(_QuantLinear):
    """4-bit codes + a (scale, zero) pair per group of ``group_size`` inputs, in one of three packings:

    - ``native`` (specdecode/kernels/quant_gemm.c, the default where it builds): qweight uint8
      [out, in / 2] in 16-row tiles, qparams int16 [2, out / 16, in / group_size, 16] (half bits of
      scale, zero). Activations are quantized to int8 per group inside the kernel.
    - ``torch`` (PyTorch's tinygemm kernels: ``_weight_int4pack_mm_for_cpu`` on CPU,
      ``_weight_int4pack_mm`` on CUDA): qweight uint8 [out, in / 2] holding the tinygemm layout (on
      CUDA the int32 [out / 8, in / (16 t), 32, t / 2] tensor of ``_convert_weight_to_int4pack``,
      t = inner k tiles, as bytes: each block of 8 rows is contiguous), qparams int16
      [in / group_size, out, 2] (bf16 bits of scale, zero); activations are cast to bfloat16.
    - ``dequant`` (any device): qweight = pack_nibbles(codes), qparams as ``torch``.

    qparams are kept as int16 so that module.to(dtype) leaves them alone. The native and torch
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
        shape = (2, out_features // TILE, groups, TILE) if native is not None else (groups, out_features, 2)
        self.register_buffer("qparams", torch.empty(shape, dtype=torch.int16))

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

    def _load_step(self, start: int, w: torch.Tensor) -> None:
        codes, scale, zero = quantize_int4(w, self.group_size,
                                           torch.float16 if self._native is not None else torch.bfloat16)
        if self._native is not None:
            self._store_scales(start, scale, zero)
        else:
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

    def _store_scales(self, start: int, scale: torch.Tensor, zero: torch.Tensor) -> None:
        """Native packing: scale/zero rows [start, start + n) into their tiles' lanes."""
        rows = torch.arange(start, start + len(scale))
        for i, values in enumerate((scale, zero)):
            self.qparams[i, rows // TILE, :, rows % TILE] = values.to(torch.float16).view(torch.int16)  # [n, groups]

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
            y = self._native.int4_gemm(x2d.float().contiguous(), w, self.qparams, self.out_features,
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
