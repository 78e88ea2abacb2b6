"""Hyper-parameters of a decoder model, read from the checkpoint's own metadata (never a table)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..layers.rotary import RopeScaling  # noqa: F401  (re-exported: part of a model's config)


@dataclass(frozen=True)
class Architecture:
    """A decoder family the engine can build (registered by its module in models/, see __init__.py).

    model: the nn.Module class, ``model(cfg, separate_head=...)``, with ``forward(ids [B, T],
    positions [B, T]) -> hidden [B, T, H]`` under a runtime Context, ``compute_logits(hidden)``,
    ``load_weights(items)`` taking Hugging Face tensor names, ``embed_tokens`` and ``lm_head``.
    gguf_names / hf_model_types: the names a GGUF file (general.architecture) or a config.json
    (model_type) gives it. gguf_permuted_qk: llama.cpp's converter permuted its q/k rows for
    interleaved RoPE (the GGUF loader undoes it). hf_defaults: ModelConfig fields a config.json of
    this family may leave out, with their values."""

    name: str
    model: type
    gguf_names: tuple[str, ...] = ()
    hf_model_types: tuple[str, ...] = ()
    gguf_permuted_qk: bool = False
    hf_defaults: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm on q and k per head
    sliding_window: int | None = None  # Mistral v0.1; None = full attention
    # Multi-token-prediction modules carried in the checkpoint (DeepSeek-V3 / GGUF nextn).
    num_nextn_layers: int = 0
