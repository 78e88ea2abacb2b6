"""Attention behind one entry point. ``attention(layer, q, k, v)`` runs the forward context's
backend over the context's KV cache; ``backend().attend`` takes explicit operands (training,
references). To add a backend (a GPU kernel, a fused CPU kernel): subclass AttentionBackend
(base.py: the contract) in a module here and add it to BACKENDS; EngineConfig.attention_backend
selects it by name."""
from __future__ import annotations

import torch

from ..context import get_context
from .base import AttentionBackend
from .native_cpu import NativeCPUBackend
from .torch_sdpa import TorchSDPABackend

BACKENDS: dict[str, type[AttentionBackend]] = {b.name: b for b in (NativeCPUBackend, TorchSDPABackend)}
DEFAULT_BACKEND = TorchSDPABackend.name  # for forwards that name none (training, references)
_instances: dict[str, AttentionBackend] = {}


def resolve(name: str, device: torch.device) -> str:
    """"auto": the batch-invariant native backend on a CPU where it builds, else PyTorch's SDPA."""
    if name != "auto":
        return name
    return NativeCPUBackend.name if device.type == "cpu" and NativeCPUBackend.available() else TorchSDPABackend.name


def backend(name: str = DEFAULT_BACKEND) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r} (choose from auto, {', '.join(BACKENDS)})")
    if name not in _instances:
        _instances[name] = BACKENDS[name]()
    return _instances[name]


def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, H, T, D], k, v [B, Hkv, T, D] of the new tokens -> o [B, H, T, D], per the forward context."""
    ctx = get_context()
    return (ctx.backend or backend()).forward(layer, q, k, v, ctx)
