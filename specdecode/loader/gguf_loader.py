"""GGUF checkpoints (llama.cpp): the config from the file's own metadata, and its tensors under Hugging
Face names, dequantized one at a time (peak memory = the model + one tensor). The file itself is read by
gguf_file.py (header, metadata, memory-mapped tensor data); blocks are dequantized by ``gguf.quants``. A
quantized runtime reuses ``GGUFFile.raw``, ``hf_name``, ``permuted_heads`` and ``unpermute_rows`` to keep
weights in block form."""
from __future__ import annotations

import math
from typing import Iterator

import gguf.quants
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QType

from ..errors import ModelFileError, UnsupportedModelError
from ..layers.rotary import rope_inv_freq
from ..layers.quant import Int4Rows
from ..models import ARCHITECTURES, allocate_model, build_model, find_architecture
from ..models.config import ModelConfig, RopeScaling
from .gguf_file import SUPPORTED_TYPES, GGUFFile, GGUFTensorInfo, Source, open_gguf
from .gguf_formats import auto_quant, head_quant

# -- names and the q/k row permutation --------------------------------------------------------------
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
                "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
                "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.ffn_up.weight' -> 'model.layers.3.mlp.up_proj.weight'; None without HF counterpart."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return None


def permuted_heads(cfg: ModelConfig, gguf_name: str) -> int | None:
    """The head count llama.cpp's converter permuted this tensor's rows with (q: heads, k: kv heads)."""
    if not ARCHITECTURES[cfg.arch].gguf_permuted_qk or not gguf_name.startswith("blk."):
        return None
    return {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}.get(gguf_name.split(".")[-2])


def unpermute_rows(x, n_head: int):
    """Undoes convert_hf_to_gguf's ``LlamaModel.permute``, which interleaves each head's two halves
    (HF rotate_half pairs rows i and i + d/2) as rows (0, d/2, 1, d/2 + 1, ...) for llama.cpp's RoPE.
    x: [rows, ...] numpy or torch (floats, or quantized bytes [rows, row_bytes]); returns a copy."""
    rows = x.shape[0]
    return x.reshape(n_head, rows // n_head // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


# -- config -------------------------------------------------------------------------------------------
def _llama3_scaling(f: GGUFFile, theta: float, head_dim: int) -> RopeScaling:
    """llama.cpp stores Llama-3.1 RoPE scaling only as ``rope_freqs.weight`` [head_dim/2], per-frequency
    divisors: 1/div = s + (1 - s)/factor with s = clamp(a*f + b, 0, 1) linear in the frequency f.
    We recover factor, a and b; any (original context, low, high) with those a, b gives the same RoPE."""
    info = f.tensors["rope_freqs.weight"]
    div = dequantize_tensor(info, f.raw(info), torch.float64).flatten()
    freq, _ = rope_inv_freq(theta, head_dim, RopeScaling())  # [head_dim/2]
    factor, eps = float(div.max()), 1e-4
    if factor <= 1 + eps or float(div.min()) >= factor - eps:
        return RopeScaling(kind="linear", factor=factor) if factor > 1 + eps else RopeScaling()
    s = (1 / div - 1 / factor) / (1 - 1 / factor)  # 1: unscaled, 0: divided by factor
    mid = (s > eps) & (s < 1 - eps)
    if int(mid.sum()) < 2:  # a bare step leaves the band underdetermined (no released model has one)
        raise UnsupportedModelError(f"{f.path}: rope_freqs.weight has too few blended frequencies")
    a, b = np.polyfit(freq[mid].numpy(), s[mid].numpy(), 1)
    # s = (orig * f / 2pi - low) / span with span = high - low: a = orig / (2pi span), b = -low / span.
    # Choose orig so that low comes out near 1 (the Llama 3.x value), rounded to an integer context.
    orig = round(-2 * math.pi * a / b) if b < 0 else 0
    span = orig / (2 * math.pi * a)
    rs = RopeScaling(kind="llama3", factor=factor, original_max_position_embeddings=orig,
                     low_freq_factor=-b * span, high_freq_factor=-b * span + span)
    if orig < 1 or not torch.allclose(rope_inv_freq(theta, head_dim, rs)[0] * div, freq, rtol=1e-4):
        raise UnsupportedModelError(f"{f.path}: rope_freqs.weight is not a Llama-3 RoPE scaling")
    return rs


def _rope_scaling(f: GGUFFile, arch: str, theta: float, head_dim: int) -> RopeScaling:
    pre = f"{arch}.rope.scaling."
    m = {k.removeprefix(pre): v for k, v in f.metadata.items() if k.startswith(pre)}
    kind, factor = m.get("type", "none"), float(m.get("factor", 1.0))
    if kind == "yarn":
        return RopeScaling(kind="yarn", factor=factor, attention_factor=m.get("yarn_attn_factor"),
                           original_max_position_embeddings=int(m.get("original_context_length", 0)),
                           beta_fast=m.get("yarn_beta_fast", 32.0), beta_slow=m.get("yarn_beta_slow", 1.0))
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if kind != "none":
        raise UnsupportedModelError(f"{f.path}: unsupported RoPE scaling {kind!r} (supported: none, linear, yarn)")
    return _llama3_scaling(f, theta, head_dim) if "rope_freqs.weight" in f.tensors else RopeScaling()


def read_gguf_config(source: Source) -> ModelConfig:
    f = open_gguf(source)
    m = f.metadata
    arch = m.get("general.architecture")  # the metadata keys' prefix
    try:
        family = find_architecture(arch, "gguf").name
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{f.path}: {e}") from None

    def get(key: str, default=None):
        if (v := m.get(f"{arch}.{key}", default)) is None:
            raise ModelFileError(f"{f.path}: GGUF metadata lacks {arch}.{key}")
        return v

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    theta = float(get("rope.freq_base", 10000.0))
    nextn = int(get("nextn_predict_layers", 0))
    vocab = get("vocab_size", 0) or len(m.get("tokenizer.ggml.tokens", ())) or \
        max((i.shape[0] for n, i in f.tensors.items() if n == "token_embd.weight"), default=0)
    return ModelConfig(
        arch=family, vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")) - nextn,  # llama.cpp counts MTP (nextn) blocks in block_count
        num_heads=heads, num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)), rope_theta=theta,
        rope_scaling=_rope_scaling(f, arch, theta, head_dim), max_position_embeddings=int(get("context_length", 4096)),
        tie_word_embeddings="output.weight" not in f.tensors, attention_bias="blk.0.attn_q.bias" in f.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors, num_nextn_layers=nextn)


# -- tensors ------------------------------------------------------------------------------------------
_CHUNK_BLOCKS = 1024  # per call: ~1 MB of float32, cache-resident (gguf's own 16-row groups: 6x slower)


def dequantize_tensor(info: GGUFTensorInfo, raw: np.ndarray, dtype: torch.dtype, shape=None) -> torch.Tensor:
    """raw uint8 [rows, row_bytes] -> tensor of info.shape in dtype."""
    if info.qtype not in SUPPORTED_TYPES:
        raise UnsupportedModelError(f"unsupported GGUF tensor type {info.qtype.name} (tensor {info.name})")
    if info.qtype in (QType.F32, QType.F16):
        out = torch.from_numpy(raw.view(np.float32 if info.qtype == QType.F32 else np.float16)).to(dtype)
    elif info.qtype == QType.BF16:
        out = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).to(dtype)
    else:
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        blocks = raw.reshape(-1, type_size)  # [n_blocks, type_size]; blocks run along the last dim
        out32 = np.empty((blocks.shape[0], block), np.float32)
        kernel = getattr(gguf.quants, info.qtype.name).dequantize_blocks  # uint8 blocks -> float32
        # numpy only inside the loop: a torch op per 1 MB chunk wakes torch's thread pool each time,
        # which costs more CPU than the dequantization itself on a busy machine.
        for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            out32[i:i + _CHUNK_BLOCKS] = kernel(blocks[i:i + _CHUNK_BLOCKS])
        out = torch.from_numpy(out32).to(dtype)
    return out.reshape(info.shape if shape is None else shape)


def _nibbles(qs: np.ndarray, n_blocks: int, run: int) -> np.ndarray:
    """uint8 [n_blocks, bytes] -> codes uint8 [n_blocks, 2 * bytes]: each run of ``run`` bytes holds
    ``run`` elements in its low nibbles, then the next ``run`` in its high nibbles (ggml's order)."""
    q = qs.reshape(n_blocks, -1, 1, run) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(15)).reshape(n_blocks, -1)


def _f16(b: np.ndarray) -> np.ndarray:
    return b.view(np.float16).astype(np.float32)  # uint8 [n, 2] -> float32 [n, 1]


def int4_rows(info: GGUFTensorInfo, raw: np.ndarray, shape) -> Int4Rows | None:
    """The rows of a Q4_0, Q4_1 or Q4_K matrix in the int4 format, decoded from the blocks without
    rounding: w = (q - 8) * scale + zero per 32 inputs, with (scale, zero) = (d, 0) for Q4_0, (d, 8d + m)
    for Q4_1 and (d * sc, 8 d sc - dmin * m) for each Q4_K sub-block; Q4_K's rows also carry their
    super-block terms (``Int4Rows.blocks``: d, sc, -dmin, m). None for other types."""
    name = info.qtype.name
    if name not in ("Q4_0", "Q4_1", "Q4_K") or len(shape) != 2:
        return None
    block, type_size = GGML_QUANT_SIZES[info.qtype]
    b = raw.reshape(-1, type_size)  # [n_blocks, type_size]
    n = b.shape[0]
    rows = shape[0]

    def per_row(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).reshape(rows, -1)
    blocks = None
    if name == "Q4_K":  # d, dmin (f16), 12 bytes of 6-bit (sc, m) for 8 sub-blocks, 128 bytes of codes
        sc, m = gguf.quants.Q4_K.get_scale_min(b[:, 4:16])  # uint8 [n, 8] each
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])  # [n, 1]
        scale = d * sc.astype(np.float32)
        zero = 8 * scale - dmin * m.astype(np.float32)
        codes = _nibbles(b[:, 16:], n, 32)
        blocks = (per_row(d), per_row(sc), per_row(-dmin), per_row(m.astype(np.int8)))
    else:  # d (f16), for Q4_1 m (f16), then 16 bytes of codes
        scale = _f16(b[:, 0:2])
        zero = np.zeros_like(scale) if name == "Q4_0" else 8 * scale + _f16(b[:, 2:4])
        codes = _nibbles(b[:, type_size - 16:], n, 16)
    return Int4Rows(per_row(codes), per_row(scale), per_row(zero), blocks)


def iter_gguf_tensors(source: Source, dtype: torch.dtype = torch.float32, cfg: ModelConfig | None = None,
                      chunk_elements: int | None = None, skip: set[str] = frozenset(), int4: bool = False
                      ) -> Iterator[tuple[str, torch.Tensor | Int4Rows, int]]:
    """(HF name, rows [n, in] in dtype, first row) one at a time, q/k rows un-permuted for llama.
    With ``chunk_elements``, large tensors arrive as several row ranges, so a quantizing loader never
    holds one whole float copy of the embedding or LM head. Tensor types are checked on the call,
    before the caller has allocated or loaded anything. ``skip``: llama.cpp names not to deliver.
    ``int4``: matrices stored in a 4-bit type of the int4 format (``int4_rows``) arrive as Int4Rows."""
    f = open_gguf(source)
    cfg = cfg or read_gguf_config(f)
    for info in f.tensors.values():
        if hf_name(info.name) and info.qtype not in SUPPORTED_TYPES:
            raise UnsupportedModelError(f"{f.path}: unsupported GGUF tensor type {info.qtype.name} "
                                        f"(tensor {info.name})")

    def tensors():
        for info in f.tensors.values():
            if (name := hf_name(info.name)) is None or info.name in skip:
                continue
            heads = permuted_heads(cfg, info.name)
            raw = f.raw(info)  # [rows, row_bytes]
            rows = raw.shape[0] if len(info.shape) > 1 else 1
            step = rows if heads or not chunk_elements else max(1, chunk_elements // max(1, info.shape[-1]))
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                shape = (r1 - r0, *info.shape[1:]) if len(info.shape) > 1 else info.shape
                t = int4_rows(info, raw[r0:r1], shape) if int4 else None
                if t is None:
                    t = dequantize_tensor(info, raw[r0:r1], dtype, shape)
                if heads:
                    t = t.map_rows(lambda x: unpermute_rows(x, heads)) if isinstance(t, Int4Rows) \
                        else unpermute_rows(t, heads)
                yield name, t, r0
            del raw, t  # float32 tensors of F32 files are views on the mapping: drop them first
            f.release(info)
    return tensors()


_QUANT_CHUNK = 1 << 22  # float elements dequantized at a time for a quantized load (16 MB in float32)


def file_embedding(f: GGUFFile, dtype: torch.dtype):
    """The token embedding as a FileEmbedding over the mapped ``token_embd.weight`` rows."""
    from ..layers.embedding import FileEmbedding

    info = f.tensors["token_embd.weight"]
    raw = f.raw(info)  # [vocab, row_bytes], a view on the file: nothing is read until a row is used
    vocab, dim = info.shape

    def read_rows(ids: np.ndarray) -> torch.Tensor:
        return dequantize_tensor(info, raw[ids], torch.float32, (len(ids), dim))
    return FileEmbedding(vocab, dim, read_rows, dtype)


def load_gguf_model(source: Source, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                    quant: str = "none", cache=None):
    """A LlamaModel with the weights of a GGUF file: dequantized to dtype (quant none), or requantized
    to int8 / int4 row range by row range (never a whole float copy of a large tensor). ``cache``: a
    weight_cache.WeightCache that a quantized model is mapped from, or saved to once converted."""
    f = open_gguf(source)
    cfg = read_gguf_config(f)
    if quant == "auto":
        quant = auto_quant(f)
    skip = set()
    cache = cache if quant != "none" else None  # a float model is not kept: its copy would be several times the file
    # a quantized model's embedding table stays in the file (see layers/embedding.py); with a cache, the
    # tensors are mapped from its entry where one matches, else allocated and converted
    model = build_model(cfg, dtype, device, quant=quant, head_quant=head_quant(f, quant) if quant != "none" else "int8",
                        embedding=file_embedding(f, dtype) if quant != "none" else None, allocate=cache is None)
    if cache is not None:
        if cache.map(model):
            return model
        model = allocate_model(model, device)
        if cache.read(model):  # an entry its filesystem could not map
            return model
    if quant != "none":
        if not cfg.tie_word_embeddings:
            skip.add("token_embd.weight")  # nothing else reads it
    # int4 layers take the file's own 4-bit codes and scales; every other consumer dequantizes them
    weights = iter_gguf_tensors(f, dtype, cfg, chunk_elements=_QUANT_CHUNK if quant != "none" else None, skip=skip,
                                int4=quant != "none")
    model.load_weights(weights)
    if cache is not None:
        cache.save(model)
    return model
