"""Decoder for the Llama family: Llama / SmolLM2, Mistral, Qwen2 / Qwen2.5 (q/k/v bias), Qwen3 (q/k norm).

``forward(input_ids [B, T], positions [B, T]) -> hidden [B, T, hidden]``; per-forward metadata (KV
slots, tree mask, layers to capture) comes from runtime.context. Logits are a separate call so that a
prefill computes the LM head for its last token only."""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..runtime.context import get_context
from ..layers.attention import Attention
from ..layers.linear import make_linear
from ..layers.mlp import SwiGLU
from ..layers.norm import RMSNorm
from ..layers.quant import Int4Rows
from ..layers.rotary import RotaryEmbedding
from .config import Architecture, ModelConfig
from .llama_native import NativeForward


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(layer_id, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                   cfg.attention_bias, cfg.qk_norm, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    # Checkpoint (Hugging Face) names packed into one of our parameters: name -> (packed name, shard).
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, cfg: ModelConfig, separate_head: bool = False):
        """separate_head: give a tied model its own LM head (a quantized copy of the embedding)."""
        super().__init__()
        self.cfg = cfg
        # _weight: no random init. The loader fills the table, and initialising it (even on the meta
        # device, where build_model constructs models) imports torch._dynamo: ~1 s of every load.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        tied = cfg.tie_word_embeddings and not separate_head
        self.lm_head = None if tied else make_linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self._native = NativeForward(self)

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ctx = get_context()
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        fused = self._native.begin(ctx, x, cos, sin)  # one native call for the layers where it applies
        if fused is not None:
            x = fused.pack(x)  # a copy, updated in place layer by layer (ragged batches: packed rows)
            bufs = {i: torch.empty_like(x) for i in ctx.capture_layers if 0 <= i < len(self.layers)}
            fused.layers(x, bufs)  # one native call; the captured layers' outputs land in bufs
            ctx.captured.update({i: fused.unpack(b) for i, b in bufs.items()})
            return self.norm(fused.unpack(x))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin)
            if i in ctx.capture_layers:
                ctx.captured[i] = x
        return self.norm(x)

    def few_tokens(self, kv, attention, slot: int, tokens: list[int], positions: list[int],
                   tree_mask: torch.Tensor | None = None, capture: tuple[int, ...] = ()
                   ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """forward's (hidden [1, T, hidden], captured {layer: [1, T, hidden]}) for a few new tokens of one
        sequence (cache slot ``slot``, RoPE ``positions``, tree_mask [T, T] or None for a chain; layers
        ``capture``), bit for bit, without the per-forward setup a batch needs; None where only forward
        runs it (NativeForward.few_tokens). attention: the runner's backend."""
        return self._native.few_tokens(kv, attention, slot, tokens, positions, tree_mask, capture)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] (already normed) -> logits [..., vocab] in float32."""
        if self.lm_head is None:
            return torch.nn.functional.linear(hidden, self.embed_tokens.weight).float()
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def head_rows(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [len(ids), hidden] rows of the LM head as compute_logits multiplies by them (the
        embedding when tied; dequantized when the head is quantized); all [vocab, hidden] rows when
        ids is None."""
        head = self.lm_head
        if head is None:
            w = self.embed_tokens.weight.detach()
            return (w if ids is None else w[ids]).float()
        if hasattr(head, "int8_rows"):  # int8 codes [V, H] x per-row scales [V]
            rows = head.int8_rows(ids).float()
            return rows * (head.scales if ids is None else head.scales[ids]).float()[:, None]
        w = head.dequantize() if hasattr(head, "dequantize") else head.weight.detach()
        return (w if ids is None else w[ids]).float()

    # -- weights ---------------------------------------------------------------------------------
    def _sizes(self, packed_name: str) -> list[int]:
        c = self.cfg
        if packed_name == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]

    def load_weights(self, weights: Iterable[tuple]) -> None:
        """Copies tensors named as in a Hugging Face checkpoint (``model.layers.0.self_attn.q_proj.weight``,
        ``lm_head.weight``...) into this model, packing q/k/v and gate/up. Items are (name, tensor) or
        (name, rows, first_row) for a checkpoint read in row ranges. Quantized layers (``load_rows``)
        quantize what they receive; rows may also arrive already in the int4 format (Int4Rows), which
        float parameters dequantize. Raises on a missing tensor."""
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        rows_seen: dict[str, int] = {}
        for item in weights:
            name, tensor = item[0], item[1]
            row0 = item[2] if len(item) > 2 else 0
            name = name.removeprefix("model.")
            targets = [name]
            if name == "embed_tokens.weight" and self.cfg.tie_word_embeddings and self.lm_head is not None:
                targets.append("lm_head.weight")  # tied in the file, separate here (a quantized head)
                if getattr(self.embed_tokens, "shared", False):  # one table: fill it once, through the head
                    targets.remove(name)
                    rows_seen[name] = rows_seen.get(name, 0) + tensor.shape[0]
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # tied: the checkpoint carries a copy of the embedding
            for target in targets:
                self._load_one(target, tensor, row0, params, modules, rows_seen)
        missing = []
        for n, p in params.items():  # every row of every weight must have arrived
            if rows_seen.get(n, 0) < (p.shape[0] if p.dim() else 1):
                missing.append(n)
        for n, m in modules.items():
            if hasattr(m, "load_rows") and rows_seen.get(f"{n}.weight", 0) < self._rows(m):
                missing.append(f"{n}.weight")
        if missing:
            from ..errors import ModelFileError
            raise ModelFileError(f"checkpoint lacks {len(missing)} tensor(s), e.g. {missing[0]}")

    @staticmethod
    def _rows(m) -> int:
        return getattr(m, "out_features", None) or m.num_embeddings

    def _load_one(self, name, tensor, row0, params, modules, rows_seen) -> None:
        target, shard = name, None
        for src, (dst, idx) in self.packed.items():
            if f".{src}." in name:
                target, shard = name.replace(src, dst), idx
                break
        offset = row0
        if shard is not None:
            offset += sum(self._sizes(target.split(".")[-2])[:shard])
        mod_name, _, leaf = target.rpartition(".")
        mod = modules.get(mod_name)
        with torch.no_grad():
            if leaf == "weight" and hasattr(mod, "load_rows"):
                mod.load_rows(offset, tensor)
            elif target in params:
                p = params[target]
                if isinstance(tensor, Int4Rows):  # a float parameter (e.g. a tied embedding)
                    tensor = tensor.dense(p.dtype)
                if p.dim() == 0 or (shard is None and row0 == 0 and tensor.numel() == p.numel()):
                    p.copy_(tensor.reshape(p.shape))
                else:
                    p.narrow(0, offset, tensor.shape[0]).copy_(tensor)
            else:
                return  # e.g. rotary inv_freq, or MTP modules loaded elsewhere
        rows_seen[target] = rows_seen.get(target, 0) + (tensor.shape[0] if tensor.dim() else 1)


# llama.cpp stores Mistral as "llama" (both converted by its LlamaModel, which permutes q/k rows).
ARCHITECTURES = (
    Architecture("llama", LlamaModel, ("llama",), ("llama",), gguf_permuted_qk=True),
    Architecture("mistral", LlamaModel, ("mistral",), ("mistral",), gguf_permuted_qk=True,
                 hf_defaults=(("use_sliding_window", True),)),
    Architecture("qwen2", LlamaModel, ("qwen2",), ("qwen2",), hf_defaults=(("attention_bias", True),)),
    Architecture("qwen3", LlamaModel, ("qwen3",), ("qwen3",), hf_defaults=(("qk_norm", True),)),
)
