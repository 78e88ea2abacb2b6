"""Weight-only quantized formats of the linear layers, one module each (int4.py, int8.py), found by
name: to add a format, write ``layers/quant/<name>.py`` with its layer class (a QuantLinear, see
base.py) and a module-level ``FORMAT = QuantFormat(...)``; ``--quant <name>`` then builds it, and
``--quant auto`` considers it. Support modules (base, formats) define no FORMAT."""
from __future__ import annotations

import importlib
import pkgutil

from .base import QuantFormat, QuantLinear
from .formats import Int4Rows, dequantize_int4, quantize_int4, quantize_int8
from .int4 import Int4Linear
from .int8 import Int8Linear

__all__ = ["FORMATS", "Int4Rows", "QuantFormat", "QuantLinear", "Int4Linear", "Int8Linear", "device_kernel", "format_names",
           "nearest_format", "quantize_int4", "quantize_int8", "dequantize_int4"]
FLOAT_BITS = 16.0  # "none": the float weights of a GGUF file run in their float dtype (f16 / bf16 at best)


def _discover() -> dict[str, QuantFormat]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        fmt = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORMAT", None)
        if isinstance(fmt, QuantFormat):
            found[fmt.name] = fmt
    return found


FORMATS: dict[str, QuantFormat] = _discover()


def format_names() -> tuple[str, ...]:
    """Every value --quant takes besides auto: none and the registered formats."""
    return ("none",) + tuple(sorted(FORMATS))


def nearest_format(bits_per_weight: float) -> str:
    """The runtime format whose bits per weight are nearest a file's (``none`` for float files)."""
    options = {name: f.bits_per_weight for name, f in FORMATS.items()} | {"none": FLOAT_BITS}
    return min(options, key=lambda name: (abs(options[name] - bits_per_weight), options[name]))


def device_kernel(name: str, device: str) -> str:
    """'torch' where PyTorch's kernel for format ``name`` runs on ``device`` and passes its check, else 'dequant'."""
    return FORMATS[name].layer.device_kernel(device)
