"""Hyper-parameters of a decoder model, read from the checkpoint's own metadata (never a table)."""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling as Hugging Face configs spell it. ``kind`` is one of
    none | linear | dynamic | llama3 | yarn; unused fields keep their defaults."""

    kind: str = "none"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None = derived from factor


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
