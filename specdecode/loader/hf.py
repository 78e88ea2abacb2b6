"""Hugging Face model directories: config.json + *.safetensors (+ tokenizer files, see tokenizer/)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch

from ..errors import ModelFileError
from ..models import find_architecture
from ..models.config import ModelConfig, RopeScaling


def rope_scaling_from_dict(d: dict | None) -> RopeScaling:
    if not d:
        return RopeScaling()
    kind = d.get("rope_type", d.get("type", "none")) or "none"
    if kind == "default":
        return RopeScaling()
    keys = {f for f in RopeScaling.__dataclass_fields__ if f != "kind"}
    return RopeScaling(kind=kind, **{k: v for k, v in d.items() if k in keys and v is not None})


def config_from_hf(cfg: dict) -> ModelConfig:
    family = find_architecture(cfg.get("model_type", ""), "hf")
    arch, defaults = family.name, dict(family.hf_defaults)
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    theta = cfg.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
    return ModelConfig(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=rope_scaling_from_dict(rope),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", defaults.get("attention_bias", False))),
        qk_norm=bool(defaults.get("qk_norm", False)),
        sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", defaults.get("use_sliding_window"))
        else None,
        num_nextn_layers=int(cfg.get("num_nextn_predict_layers", 0) or 0),
    )


def read_hf_config(path: Path) -> ModelConfig:
    f = Path(path) / "config.json"
    if not f.is_file():
        raise ModelFileError(f"{path}: not a model directory (no config.json)")
    try:
        return config_from_hf(json.loads(f.read_text()))
    except (json.JSONDecodeError, KeyError) as e:
        raise ModelFileError(f"{f}: unreadable config ({e.__class__.__name__}: {e})") from None


def iter_hf_tensors(path: Path, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) one at a time from every *.safetensors file, cast to dtype."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{path}: no *.safetensors files")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    yield name, st.get_tensor(name).to(dtype)
        except (OSError, ValueError, RuntimeError) as e:
            if isinstance(e, ModelFileError):
                raise
            raise ModelFileError(f"{f}: unreadable safetensors file ({e})") from None
