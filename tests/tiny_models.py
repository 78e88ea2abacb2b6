"""Small random-weight Hugging Face models built in the tests, and ours loaded from the same weights."""
from __future__ import annotations

import torch

from specdecode.engine.kv_cache import KVCache
from specdecode.engine.model_runner import ModelRunner
from specdecode.loader.hf import config_from_hf
from specdecode.models import build_model

BASE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)


def hf_model(model_type: str = "llama", seed: int = 0, dtype=torch.float32, **overrides):
    import transformers

    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[model_type]
    kw = dict(BASE, **{"tie_word_embeddings": False, **overrides})
    if model_type == "qwen3":
        kw.setdefault("head_dim", 16)
    cfg = cls[0](**kw)
    torch.manual_seed(seed)
    m = cls[1](cfg).to(dtype).eval()
    with torch.no_grad():  # random norms and biases so that every weight matters in comparisons
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return m


def ours_from_hf(m, dtype=torch.float32, num_slots: int = 4, max_len: int = 256) -> ModelRunner:
    cfg = config_from_hf(m.config.to_dict())
    model = build_model(cfg, dtype)
    model.load_weights((n, t.to(dtype)) for n, t in m.state_dict().items())
    kv = KVCache(cfg.num_layers, num_slots, max_len, cfg.num_kv_heads, cfg.head_dim, dtype)
    return ModelRunner(model, kv)
