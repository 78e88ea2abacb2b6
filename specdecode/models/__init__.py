"""Model architectures, one module per family, found by scanning this package: to add one, write
``models/<family>.py`` with its nn.Module and a module-level ``ARCHITECTURES`` tuple of
``Architecture`` (config.py: the contract); the loaders then map GGUF and config.json names to it.
``build_model`` allocates a model without initialising it; the loader fills the weights."""
from __future__ import annotations

import importlib
import pkgutil

import torch
from torch import nn

from ..errors import UnsupportedModelError
from ..layers.quant import FORMATS, device_kernel, format_names
from ..runtime import host_memory
from .config import Architecture, ModelConfig


def _discover() -> dict[str, Architecture]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        for arch in getattr(importlib.import_module(f"{__name__}.{info.name}"), "ARCHITECTURES", ()):
            found[arch.name] = arch
    return found


ARCHITECTURES: dict[str, Architecture] = _discover()


def find_architecture(name: str, source: str = "gguf") -> Architecture:
    """The architecture a GGUF file (source="gguf": general.architecture) or a config.json
    (source="hf": model_type) names; a clear error if none is registered."""
    for arch in ARCHITECTURES.values():
        if name in (arch.gguf_names if source == "gguf" else arch.hf_model_types):
            return arch
    known = sorted({n for a in ARCHITECTURES.values() for n in (a.gguf_names if source == "gguf" else a.hf_model_types)})
    what = "architecture" if source == "gguf" else "model_type"
    raise UnsupportedModelError(f"unsupported {what} {name!r} (supported: {', '.join(known)})")


def _layer_kernel(quant: str, device: torch.device) -> str:
    """The native kernels are CPU code; elsewhere PyTorch's, where they pass their check on this device."""
    if device.type == "cpu":
        return "auto"
    return device_kernel(quant, str(device))


def _quantized(linear: nn.Linear, quant: str, device: torch.device) -> nn.Module:
    """``linear`` in format ``quant``, else in its fallback format; a shape no format takes stays float."""
    while quant is not None:
        layer = FORMATS[quant].make(linear, _layer_kernel(quant, device))
        if layer is not None:
            return layer
        quant = FORMATS[quant].fallback
    return linear


def build_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                quant: str = "none", head_quant: str = "int8", embedding: nn.Module | None = None,
                allocate: bool = True) -> nn.Module:
    """quant: weight format of the decoder's linear layers (none = dtype); the LM head gets
    ``head_quant`` and the embedding table int8 rows whenever quant != none, unless ``embedding``
    (a ready module, e.g. the GGUF loader's FileEmbedding) is given: then that one is used.
    allocate=False leaves every tensor on the meta device, laid out for ``device``: for tensors that
    come from elsewhere (a mapped file), else ``allocate_model``. A tied int8 embedding needs allocate."""
    if cfg.arch not in ARCHITECTURES:
        raise UnsupportedModelError(f"unsupported architecture {cfg.arch!r} (supported: {', '.join(ARCHITECTURES)})")
    if quant not in format_names():
        raise UnsupportedModelError(f"unknown quantization {quant!r} (choose from {', '.join(format_names())})")
    with torch.device("meta"):
        model = ARCHITECTURES[cfg.arch].model(cfg, separate_head=quant != "none").to(dtype=dtype)
        if quant != "none":
            from ..layers.embedding import Int8Embedding

            for mod in list(model.modules()):
                for name, child in list(mod.named_children()):
                    if isinstance(child, nn.Linear):
                        setattr(mod, name, _quantized(child, head_quant if name == "lm_head" else quant,
                                                      torch.device(device)))
            # set before allocation, so that the float table it replaces is never allocated
            model.embed_tokens = embedding if embedding is not None else \
                Int8Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
    model.quant = quant  # read by the engine (KV-cache type) and reports
    model = model.eval().requires_grad_(False)
    if not allocate:
        return model
    model = allocate_model(model, device)
    if quant != "none" and embedding is None and cfg.tie_word_embeddings and hasattr(model.lm_head, "int8_rows"):
        model.embed_tokens.share_with(model.lm_head)  # one int8 table for the tied embedding and head
    return model


def allocate_model(model: nn.Module, device: str | torch.device) -> nn.Module:
    """The tensors of a model that build_model left on the meta device, allocated on ``device``,
    uninitialised but for the norms' weights (ones)."""
    # Each tensor allocated once, uninitialised, in its final dtype: loading a model never holds a second
    # full copy of it. On the CPU in huge pages, which a decode step streams faster (runtime/host_memory.py).
    # (nn.Module.to_empty allocates through torch.empty_like, whose meta path imports sympy: ~0.3 s of
    # every load.)
    model = host_memory.allocate(model, device)
    for m in model.modules():
        if m.__class__.__name__ == "RMSNorm":
            torch.nn.init.ones_(m.weight)
    return model.requires_grad_(False)
