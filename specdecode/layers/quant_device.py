"""Which kernel a quantized layer uses on a device other than the CPU.

On CUDA, PyTorch's own weight-only kernels (``_weight_int4pack_mm``, ``_weight_int8pack_mm``) are
the fast path, but their packing and signatures have changed across PyTorch versions, and this work
had no GPU to test them on. So before the model builder trusts one, it runs it once per device on a
small random layer against the ``dequant`` kernel (plain codes dequantized to x's dtype and
multiplied by ``F.linear``, the same arithmetic on every device): agreement within bfloat16 rounding
selects ``torch``, anything else (an error, a wrong packing) selects ``dequant`` with a warning.
"""
from __future__ import annotations

import functools
import warnings

import torch

# Relative to max |reference| over the check's outputs: bfloat16 activations and results round at
# 2^-9 relative, summed over 256 inputs ~16x that at worst; a misplaced nibble or scale errs by
# O(1) of the output range.
CHECK_RTOL = 0.03


def _layer(kind: str, weight: torch.Tensor, kernel: str, device: torch.device):
    from .quant import Int4Linear, Int8Linear

    layer = (Int4Linear(256, 64, group_size=32, kernel=kernel) if kind == "int4"
             else Int8Linear(256, 64, kernel=kernel)).to(device)
    layer.load_rows(0, weight)
    return layer


@functools.lru_cache(maxsize=None)
def device_kernel(kind: str, device: str) -> str:
    """'torch' if PyTorch's ``kind`` (int4 | int8) kernel runs on ``device`` and agrees with the
    dequant kernel on a random 64 x 256 layer, else 'dequant'."""
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(3, 256, generator=g).to(dev, torch.bfloat16)
    try:
        with torch.no_grad():
            ref = _layer(kind, w, "dequant", dev)(x).float()
            got = _layer(kind, w, "torch", dev)(x).float()
        err = float((got - ref).abs().max())
        ok = err <= CHECK_RTOL * float(ref.abs().max())
        why = f"differs from the dequant reference by {err:.3g}"
    except (RuntimeError, NotImplementedError) as e:  # a missing op, a packing the op refuses
        ok, why = False, str(e).splitlines()[0]
    if not ok:
        warnings.warn(f"PyTorch's {kind} kernel on {device} {why}: using the slower dequant kernel")
    return "torch" if ok else "dequant"
