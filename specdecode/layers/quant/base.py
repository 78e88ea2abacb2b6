"""Weight-only quantized linear layers, the shared part: ``Int8Linear`` (int8, one scale per output row) and
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
``check_device_kernel`` (below) checks each against ``dequant`` once per device before the model builder
uses it, and takes ``dequant`` where the check fails.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ...kernels import native_kernels
from .formats import Int4Rows

_STEP_ELEMENTS = 1 << 22


def _kernel_input(x2d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [M, in] -> contiguous [M, in] in dtype whose data starts on a 64-byte boundary."""
    xc = x2d.to(dtype).contiguous()
    return xc if xc.data_ptr() % 64 == 0 else xc.clone()


class QuantLinear(nn.Module):
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

    @classmethod
    def device_kernel(cls, device: str) -> str:
        """'torch' where PyTorch's kernel for this format runs on ``device`` and passes its check, else 'dequant'."""
        return check_device_kernel(cls, device)

    @classmethod
    def check_layer(cls, kernel: str) -> "QuantLinear":
        """A small [64, 256] layer of this format with ``kernel``, for the device check."""
        raise NotImplementedError

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
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, **kwargs) -> "QuantLinear":
        """weight [out, in] float (any float dtype), bias [out] or None."""
        out_features, in_features = weight.shape
        if weight.device.type != "cpu":  # the native kernels are CPU code
            kwargs.setdefault("kernel", cls.device_kernel(str(weight.device)))
        layer = cls(in_features, out_features, bias is not None, **kwargs).to(weight.device)
        layer.load_rows(0, weight)
        if bias is not None:
            with torch.no_grad():
                layer.bias.copy_(bias)
        return layer

    @torch.no_grad()
    def load_rows(self, offset: int, rows: torch.Tensor | Int4Rows) -> None:
        """Quantizes rows [n, in] of the float weight into output rows [offset, offset + n). Rows already
        in the int4 format (Int4Rows) are stored as they are where ``takes_int4`` says so, else
        dequantized first."""
        n = rows.shape[0]
        if rows.dim() != 2 or rows.shape[1] != self.in_features or offset < 0 or offset + n > self.out_features:
            raise ValueError(f"rows {tuple(rows.shape)} at offset {offset} do not fit a "
                             f"[{self.out_features}, {self.in_features}] weight")
        if isinstance(rows, Int4Rows) and not self.takes_int4(rows):
            rows = rows.dense()
        step = max(64, _STEP_ELEMENTS // self.in_features // 64 * 64)
        dev = self._weight_device()
        start = offset
        while start < offset + n:
            end = min(offset + n, (start // step + 1) * step)  # absolute boundaries: multiples of 64
            part = rows[start - offset:end - offset]
            self._load_step(start, part.map_rows(lambda t: t.to(dev)) if isinstance(part, Int4Rows)
                            else part.to(dev, torch.float32))
            start = end

    def takes_int4(self, rows: Int4Rows) -> bool:
        """Whether ``_load_step`` stores these int4 rows without requantizing them."""
        return False

    def _weight_device(self) -> torch.device:
        """The device of the quantized weight; raises where the format has no kernel."""
        raise NotImplementedError

    def _load_step(self, start: int, w: torch.Tensor | Int4Rows) -> None:
        """Stores rows [start, start + len(w)): float32 rows, or Int4Rows where takes_int4 accepted them."""
        raise NotImplementedError

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y [M, out] -> [..., out] in x's dtype, plus bias (the float32 bias promotes a bf16 y)."""
        bias = self.bias
        if bias is not None:
            y = y + bias
        return y.to(x.dtype).view(x.shape[:-1] + (self.out_features,))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


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


# Relative to max |reference| over the check's outputs: bfloat16 activations and results round at
# 2^-9 relative, summed over 256 inputs ~16x that at worst; a misplaced nibble or scale errs by
# O(1) of the output range.
CHECK_RTOL = 0.03


@functools.lru_cache(maxsize=None)
def check_device_kernel(cls: type, device: str) -> str:
    """Which kernel a quantized layer class uses on a device other than the CPU.

    On CUDA, PyTorch's own weight-only kernels (``_weight_int4pack_mm``, ``_weight_int8pack_mm``) are
    the fast path, but their packing and signatures have changed across PyTorch versions. So before
    the model builder trusts one, it runs it once per device on a small random layer
    (``cls.check_layer``) against the ``dequant`` kernel (plain codes dequantized to x's dtype and
    multiplied by ``F.linear``, the same arithmetic on every device): agreement within bfloat16
    rounding selects 'torch', anything else (an error, a wrong packing) 'dequant' with a warning."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(3, 256, generator=g).to(dev, torch.bfloat16)

    def layer(kernel):
        m = cls.check_layer(kernel).to(dev)
        m.load_rows(0, w)
        return m
    try:
        with torch.no_grad():
            ref = layer("dequant")(x).float()
            got = layer("torch")(x).float()
        err = float((got - ref).abs().max())
        ok = err <= CHECK_RTOL * float(ref.abs().max())
        why = f"differs from the dequant reference by {err:.3g}"
    except (RuntimeError, NotImplementedError) as e:  # a missing op, a packing the op refuses
        ok, why = False, str(e).splitlines()[0]
    if not ok:
        warnings.warn(f"PyTorch's {cls.kind} kernel on {device} {why}: using the slower dequant kernel")
    return "torch" if ok else "dequant"


@dataclass(frozen=True)
class QuantFormat:
    """A weight format of the decoder's linear layers (EngineConfig.quant names it).
    make(linear, kernel) -> the quantized layer replacing ``linear`` (same shape, allocated on the
    meta device, filled later by the loader), or None where the format cannot take the shape.
    bits_per_weight: what a weight costs in memory, codes plus scales (``--quant auto`` picks the
    format nearest a GGUF file's own). fallback: the format tried for a shape this one refuses."""

    name: str
    bits_per_weight: float
    layer: type
    make: Callable[[nn.Linear, str], nn.Module | None]
    fallback: str | None = None

