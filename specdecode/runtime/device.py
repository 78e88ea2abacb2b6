"""Device and element types from the configuration's strings."""
from __future__ import annotations

import torch

from ..errors import InvalidRequestError

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """auto device = cuda if available, else cpu; auto dtype = bfloat16 on CUDA, float32 elsewhere."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise InvalidRequestError(f"unknown dtype {dtype!r} ({', '.join(DTYPES)})")
    return dev, DTYPES[dtype]


def fast_bf16(device: torch.device | str) -> bool:
    """Whether bfloat16 matrix products run natively on ``device``. CPUs without AVX512-BF16 / AMX
    (Zen 3, most client laptops) emulate them, several times slower than float32."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if dev.type != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def kv_dtype(kv_cache_dtype: str, quant: str, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type (EngineConfig.kv_cache_dtype) for a model whose linears are ``quant``:
    auto = bfloat16 for a quantized model on CPU, else the model's dtype."""
    if kv_cache_dtype == "auto":
        return torch.bfloat16 if quant != "none" and device.type == "cpu" else dtype
    return resolve_device_dtype(str(device), kv_cache_dtype)[1]
