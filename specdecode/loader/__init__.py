"""Checkpoint loading: a GGUF file or a Hugging Face directory -> (model, tokenizer, config)."""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..errors import ModelFileError
from ..models import build_model


def load_checkpoint(path: str | Path, dtype: torch.dtype, device: str | torch.device, quant: str = "none",
                    weight_cache: bool = False):
    """Returns (model, tokenizer). ``path`` is a local .gguf file or a model directory; ``quant`` is
    none | int8 | int4 | auto (auto: the closest to a GGUF file's own bit width; none for HF dirs).
    weight_cache: a quantized GGUF model on the CPU is read from its converted copy under the cache
    directory (store.cache_dir() / "weights"), or converted and saved there (weight_cache.py)."""
    from ..tokenizer import Tokenizer

    path = Path(path)
    if path.is_dir():
        from .hf import iter_hf_tensors, read_hf_config

        cfg = read_hf_config(path)
        quant = "none" if quant == "auto" else quant
        model = build_model(cfg, dtype, device, quant=quant)
        model.load_weights(iter_hf_tensors(path, dtype))
        return model, Tokenizer.from_hf_dir(path)
    if not path.exists():
        raise ModelFileError(f"{path}: no such file or directory")
    from .gguf_file import GGUFFile
    from .gguf_loader import load_gguf_model

    cache = None
    if weight_cache and torch.device(device).type == "cpu":
        from ..store import cache_dir
        from .weight_cache import WeightCache

        cache = WeightCache(path, cache_dir() / "weights")
    f = GGUFFile(path)  # parsed once, for the weights and the tokenizer
    model, tok = load_gguf_model(f, dtype, device, quant, cache), Tokenizer.from_gguf(f)
    release_free_heap()
    return model, tok


def weight_quant(quant: str, device: torch.device) -> str:
    """``quant`` (EngineConfig.quant, SpecConfig.quant_draft) as it runs on ``device``. Off the CPU,
    auto keeps the file's bit width only where PyTorch's int4 and int8 kernels pass their check on
    this device (layers/quant); otherwise it means the float dtype (the dequant kernel saves memory,
    not time)."""
    from ..layers.quant import device_kernel

    if quant == "auto" and device.type != "cpu" and \
            "dequant" in (device_kernel("int4", str(device)), device_kernel("int8", str(device))):
        return "none"
    return quant


def release_free_heap() -> None:
    """Hands freed heap pages back to the OS (glibc only). Loading frees many 1-16 MB temporaries
    (dequantized row ranges) that glibc keeps for reuse once its mmap threshold has risen; they are
    never needed again, and returning them takes ~70 MB off the resident size of a 1.5B model."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do
