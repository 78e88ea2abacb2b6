"""GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them, from tiny Hugging Face models.

Deliberately independent of specdecode's loader: tensor names come from gguf's own TensorNameMap (the
converter's table), the q/k permutation is the converter's ``LlamaModel.permute`` verbatim in effect,
and the expected weights are decoded with ``gguf.quants.dequantize`` and un-permuted by index."""
from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
K_QUANTS = (Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
# Per K-quant: byte offsets of the float16 super-block scales (d, then dmin where the type has one) in a
# block, and the largest |sub-scale * code| the other bytes can make. Every other byte is a valid code, so
# random bytes with d = 0.05 / that product are a valid block of weights within +-0.05.
_K_SCALES = {Q.Q2_K: ((80, 82), 15 * 3), Q.Q3_K: ((108,), 32 * 4), Q.Q4_K: ((0, 2), 63 * 15),
             Q.Q5_K: ((0, 2), 63 * 31), Q.Q6_K: ((208,), 128 * 32)}


def converter_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute (with n_head already the kv count for k)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def encode(data: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """The stored form of float32 [rows, cols]: F32/F16 arrays, or uint8 [rows, row_bytes] blocks.
    gguf-py cannot quantize K-quants, so those get random valid blocks (the data is then ignored)."""
    if qtype == Q.F32:
        return data.astype(np.float32)
    if qtype == Q.F16:
        return data.astype(np.float16)
    if qtype in K_QUANTS:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (data.size // block, size), dtype=np.uint8)
        offsets, largest = _K_SCALES[qtype]
        for off in offsets:
            raw[:, off:off + 2] = np.full(len(raw), 0.05 / largest, np.float16).view(np.uint8).reshape(-1, 2)
        return raw.reshape(data.shape[0], -1)
    return gguf.quants.quantize(data, qtype)


def decode(stored: np.ndarray, qtype: Q) -> np.ndarray:
    return stored.astype(np.float32) if qtype in (Q.F32, Q.F16) else gguf.quants.dequantize(stored, qtype)


def llama3_rope_freqs(d: dict, rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors for rope_type llama3; note that the
    converter reads original_max_position_embeddings from the top level of config.json (default 8192)."""
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = d.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def write_gguf(hf, path: Path, qtype_for=lambda name: Q.F32, seed: int = 0) -> dict:
    """Writes ``hf`` (a transformers *ForCausalLM) to ``path``; ``qtype_for(hf_name)`` picks each 2-D
    tensor's type (1-D ones stay F32, as in the converter). Returns {HF name: float64 tensor} of what the
    file decodes to, in HF row order: the weights a reference model must hold to match the file."""
    d = hf.config.to_dict()
    arch = {"mistral": "llama"}.get(d["model_type"], d["model_type"])  # llama.cpp: Mistral = llama
    heads, kv = d["num_attention_heads"], d["num_key_value_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // heads
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(d["max_position_embeddings"])
    w.add_embedding_length(d["hidden_size"])
    w.add_block_count(d["num_hidden_layers"])
    w.add_feed_forward_length(d["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(rope.get("rope_theta", d.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(d["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if arch == "llama":
        w.add_vocab_size(d["vocab_size"])
        w.add_rope_dimension_count(head_dim)
    kind = rope.get("rope_type", "default")
    if kind in ("linear", "yarn"):
        w.add_rope_scaling_type(gguf.RopeScalingType(kind))
        w.add_rope_scaling_factor(rope["factor"])
    if kind == "yarn":
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(d["vocab_size"])])
    if kind == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(d, rope, head_dim))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], d["num_hidden_layers"])
    rng, expected = np.random.default_rng(seed), {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and d.get("tie_word_embeddings"):
            continue  # a tied checkpoint has no lm_head tensor, so the file has no output.weight
        data = t.float().numpy()
        order = np.arange(data.shape[0])  # stored row j holds HF row order[j]
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            order = converter_permute(order, heads if ".q_proj." in name else kv)
        qtype = qtype_for(name) if data.ndim == 2 else Q.F32
        stored = encode(data[order], qtype, rng)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), stored,
                     raw_dtype=qtype if stored.dtype == np.uint8 else None)
        expected[name] = torch.from_numpy(decode(stored, qtype).reshape(data.shape)[np.argsort(order)]).double()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def reference_model(hf, expected: dict):
    """``hf`` (float64) holding the decoded weights; a tied lm_head follows the embedding."""
    missing, unexpected = hf.double().load_state_dict(expected, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return hf
