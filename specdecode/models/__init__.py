"""Model architectures. ``build_model`` allocates without initialising; the loader fills the weights."""
from __future__ import annotations

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .config import SUPPORTED_ARCHS, ModelConfig
from .llama import LlamaModel

QUANT_KINDS = ("none", "int8", "int4")
INT4_GROUP = 32  # GGUF Q4_K sub-block size: 4x finer scales than 128, for ~5-12% more time per GEMV (measured)


def _layer_kernel(quant: str, device: torch.device) -> str:
    """The native kernels are CPU code; elsewhere PyTorch's, where they pass their check on this device."""
    if device.type == "cpu":
        return "auto"
    from ..layers.quant_device import device_kernel

    return device_kernel(quant, str(device))


def _quantized(linear: nn.Linear, quant: str, device: torch.device) -> nn.Module:
    from ..layers.quant import Int4Linear, Int8Linear

    bias = linear.bias is not None
    kernel = _layer_kernel(quant, device)
    if quant == "int4" and linear.in_features % INT4_GROUP == 0 and linear.out_features % 16 == 0:
        return Int4Linear(linear.in_features, linear.out_features, bias, group_size=INT4_GROUP, kernel=kernel)
    if linear.in_features % 16 == 0:
        return Int8Linear(linear.in_features, linear.out_features, bias, kernel=kernel)
    return linear  # a shape no kernel takes stays in the float dtype


def build_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                quant: str = "none", head_quant: str = "int8", embedding: nn.Module | None = None) -> LlamaModel:
    """quant: weight format of the decoder's linear layers (none = dtype); the LM head gets
    ``head_quant`` and the embedding table int8 rows whenever quant != none, unless ``embedding``
    (a ready module, e.g. the GGUF loader's FileEmbedding) is given: then that one is used."""
    if cfg.arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"unsupported architecture {cfg.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    if quant not in QUANT_KINDS:
        raise UnsupportedModelError(f"unknown quantization {quant!r} (choose from {', '.join(QUANT_KINDS)})")
    with torch.device("meta"):
        model = LlamaModel(cfg, separate_head=quant != "none")
        model = model.to(dtype=dtype)
        if quant != "none":
            from ..layers.embedding import Int8Embedding

            for mod in list(model.modules()):
                for name, child in list(mod.named_children()):
                    if isinstance(child, nn.Linear):
                        setattr(mod, name, _quantized(child, head_quant if name == "lm_head" else quant,
                                                      torch.device(device)))
            # set before to_empty, so that the float table it replaces is never allocated
            model.embed_tokens = embedding if embedding is not None else \
                Int8Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
    # to_empty allocates each tensor once, uninitialised, in its final dtype: loading a model never
    # holds a second full copy of it.
    model = model.to_empty(device=device)
    if quant != "none" and embedding is None and cfg.tie_word_embeddings and hasattr(model.lm_head, "int8_rows"):
        model.embed_tokens.share_with(model.lm_head)  # one int8 table for the tied embedding and head
    for m in model.modules():
        if m.__class__.__name__ == "RMSNorm":
            torch.nn.init.ones_(m.weight)
    model.quant = quant  # read by the engine (KV-cache type) and reports
    return model.eval().requires_grad_(False)
