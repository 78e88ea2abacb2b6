"""Model architectures. ``build_model`` allocates without initialising; the loader fills the weights."""
from __future__ import annotations

import torch

from ..errors import UnsupportedModelError
from .config import SUPPORTED_ARCHS, ModelConfig
from .llama import LlamaModel


def build_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> LlamaModel:
    if cfg.arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"unsupported architecture {cfg.arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    with torch.device("meta"):
        model = LlamaModel(cfg)
    # to_empty allocates each parameter once, uninitialised, in its final dtype: loading a model never
    # holds a second full copy of it.
    model = model.to(dtype=dtype).to_empty(device=device)
    for m in model.modules():
        if hasattr(m, "weight") and m.__class__.__name__ == "RMSNorm":
            torch.nn.init.ones_(m.weight)
    return model.eval().requires_grad_(False)
