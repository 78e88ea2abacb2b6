"""Multi-token-prediction (MTP) modules, DeepSeek-V3 style, as carried inside checkpoints
(Hugging Face ``num_nextn_predict_layers``, GGUF ``blk.N.nextn.*``).

Module m predicts the token after next from the target's hidden state h_i [H] and the next token t_{i+1}:
    x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])     [2H] -> [H]
    g = block(x)                                          one decoder block with its own KV cache (layer id m)
    logits = head(shared_head.norm(g))                    the target's LM head unless the module carries one
h_i is the target's *final, normed* hidden state: vLLM and SGLang feed their MTP layers the main model's
output after its last norm, so published heads expect that. Chaining feeds g (the block output before the
shared-head norm, as vLLM does) back as the next step's hidden state, with the drafted token.

Parameter names mirror the Hugging Face layout under ``model.layers.{num_hidden_layers + m}.``: the block's
own (self_attn.*, mlp.*, input_layernorm, post_attention_layernorm) plus eh_proj, enorm, hnorm,
shared_head.norm and the optional shared_head.head and embed_tokens. q/k/v and gate/up are packed here
as in the target; ``hf_tensors`` / ``load_weights`` convert."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..layers.linear import make_linear
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding, apply_rotary
from ..runtime.attention import backend
from .config import ModelConfig
from .llama import DecoderLayer, LlamaModel


@dataclass(frozen=True)
class MTPConfig:
    model: ModelConfig  # the target's hyper-parameters: the block has the target's shapes
    num_modules: int = 1
    own_head: bool = False  # shared_head.head present (else the target's LM head)
    own_embed: bool = False  # embed_tokens present (else the target's embedding)


class SharedHead(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        c = cfg.model
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head = make_linear(c.hidden_size, c.vocab_size, bias=False) if cfg.own_head else None


class MTPLayer(DecoderLayer):
    """A decoder block plus the MTP input fusion and output head."""

    def __init__(self, cfg: MTPConfig, m: int):
        super().__init__(cfg.model, m)  # layer id m: the m-th layer of the MTP KV cache
        c = cfg.model
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = make_linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.shared_head = SharedHead(cfg)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, _weight=torch.empty(c.vocab_size, c.hidden_size)) \
            if cfg.own_embed else None  # _weight: no random init (the loader fills it; see LlamaModel)

    def fuse(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """embeds [B, T, H] of t_{i+1}, hidden [B, T, H] h_i -> block input [B, T, H]."""
        return self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))


class MTPHead(nn.Module):
    def __init__(self, cfg: MTPConfig):
        super().__init__()
        self.cfg = cfg
        c = cfg.model
        self.layers = nn.ModuleList(MTPLayer(cfg, m) for m in range(cfg.num_modules))
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta, c.rope_scaling)

    def _input(self, m: int, ids: torch.Tensor, hidden: torch.Tensor, target: LlamaModel) -> torch.Tensor:
        layer = self.layers[m]
        embed = layer.embed_tokens if layer.embed_tokens is not None else target.embed_tokens
        return layer.fuse(embed(ids).to(hidden.dtype), hidden)  # training: a bfloat16 target, float32 head

    def forward(self, m: int, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                target: LlamaModel) -> torch.Tensor:
        """Inference path over the MTP KV cache of the forward context (runtime/context.py): ids [B, T] (t_{i+1}), hidden [B, T, H]
        (h_i), positions [B, T] (i) -> block output g [B, T, H]."""
        x = self._input(m, ids, hidden, target)
        cos, sin = self.rotary(positions, x.dtype)
        return self.layers[m](x, cos, sin)

    def forward_explicit(self, m: int, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                         target: LlamaModel, past: tuple[torch.Tensor, torch.Tensor] | None = None,
                         mask: torch.Tensor | None = None):
        """The same block with explicit keys instead of a cache (training, references). past: keys and
        values [B, Hkv, S, D] of earlier passes; mask [T, S + T] bool (True = attend), default causal
        over the T new tokens. Returns (g [B, T, H], k, v [B, Hkv, T, D])."""
        layer = self.layers[m]
        a = layer.self_attn
        x = self._input(m, ids, hidden, target)
        cos, sin = self.rotary(positions, x.dtype)
        B, T, _ = x.shape
        q, k, v = a.qkv_proj(layer.input_layernorm(x)).split([a.h * a.d, a.hkv * a.d, a.hkv * a.d], dim=-1)
        q, k = q.view(B, T, a.h, a.d), k.view(B, T, a.hkv, a.d)
        if a.q_norm is not None:
            q, k = a.q_norm(q), a.k_norm(k)
        q = apply_rotary(q.transpose(1, 2), cos, sin)  # [B, H, T, D]
        k = apply_rotary(k.transpose(1, 2), cos, sin)  # [B, Hkv, T, D]
        v = v.view(B, T, a.hkv, a.d).transpose(1, 2)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        o = backend().attend(q, keys, values, None if mask is None else mask[None, None], causal=mask is None)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, a.h * a.d))
        return x + layer.mlp(layer.post_attention_layernorm(x)), k, v

    def head_weight(self, m: int, target: LlamaModel) -> torch.Tensor:
        """The [V, H] output matrix module m uses (training computes logits over a subset of its rows)."""
        sh = self.layers[m].shared_head
        if sh.head is not None:
            return sh.head.weight
        return target.lm_head.weight if target.lm_head is not None else target.embed_tokens.weight

    def compute_logits(self, m: int, g: torch.Tensor, target: LlamaModel) -> torch.Tensor:
        """g [..., H] block output -> logits [..., V] float32."""
        sh = self.layers[m].shared_head
        h = sh.norm(g)
        return sh.head(h).float() if sh.head is not None else target.compute_logits(h)

    # -- weights: Hugging Face names relative to model.layers.{num_hidden_layers + m} -------------
    def _split_sizes(self, packed: str) -> list[int]:
        c = self.cfg.model
        if packed == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]

    def _shards(self, name: str) -> list[int | None]:
        packed = name.split(".")[-2]
        return list(range(len(self._split_sizes(packed)))) if packed in ("qkv_proj", "gate_up_proj") else [None]

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """('layers.{m}.self_attn.q_proj.weight', tensor), ... with q/k/v and gate/up unpacked."""
        unpack = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
        for name, p in self.named_parameters():
            packed = name.split(".")[-2]
            if packed not in unpack:
                yield name, p.detach()
                continue
            for part, t in zip(unpack[packed], p.detach().split(self._split_sizes(packed))):
                yield name.replace(packed, part), t

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies ('layers.{m}.<HF name>', tensor) pairs in, packing q/k/v and gate/up. Raises ModelFileError
        on a missing tensor or a shape that does not fit the target's."""
        from ..errors import ModelFileError

        params, seen = dict(self.named_parameters()), set()
        for name, tensor in weights:
            target, shard = name, None
            for src, (dst, idx) in LlamaModel.packed.items():
                if f".{src}." in name:
                    target, shard = name.replace(src, dst), idx
                    break
            if target not in params:
                continue
            p = params[target]
            if shard is not None:
                sizes = self._split_sizes(target.split(".")[-2])
                p = p.narrow(0, sum(sizes[:shard]), sizes[shard])
            if tuple(tensor.shape) != tuple(p.shape):
                raise ModelFileError(f"MTP tensor {name} has shape {list(tensor.shape)}, the model needs "
                                     f"{list(p.shape)}")
            with torch.no_grad():
                p.copy_(tensor)
            seen.add(f"{target}#{shard}")
        need = {f"{n}#{s}" for n in params for s in self._shards(n)}
        if missing := sorted(need - seen):
            raise ModelFileError(f"MTP heads lack {len(missing)} tensor(s), e.g. {missing[0].split('#')[0]}")


def ttt_mask(T: int, s: int, device) -> torch.Tensor:
    """[T, s*T] bool for pass s: query p attends pass-1 keys at positions <= p - s + 1 and the key of pass j
    (2 <= j <= s) at position p - s + j, the entries chained drafting has written when it reaches p."""
    p = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    parts = [j <= p - s + 1] + [j == p - s + k for k in range(2, s + 1)]
    return torch.cat(parts, dim=1)


def chained_explicit(head: MTPHead, target, nxt: torch.Tensor, h_in: torch.Tensor, passes: int):
    """Chained drafting over whole sequences at once, for training (EAGLE's "training-time test"): yields
    each pass's block output g [B, T, H] over positions p = 0 .. T-1 (nxt [B, T] = t_{p+1}, h_in [B, T, H] =
    h_p). Pass s at p equals draft step s of the cache path whose real pairs end at p - s + 1, with the true
    tokens standing in for the drafts."""
    B, T = nxt.shape
    pos = torch.arange(T, device=nxt.device).expand(B, -1)
    keys, values = [], []
    for s in range(1, passes + 1):
        past = None if s == 1 else (torch.cat(keys, 2), torch.cat(values, 2))
        g, k, v = head.forward_explicit(0, nxt, h_in, pos, target, past, None if s == 1 else ttt_mask(T, s, nxt.device))
        keys.append(k)
        values.append(v)
        yield g
        h_in = F.pad(g[:, :-1], (0, 0, 1, 0))  # pass s + 1 at p reads this pass's output at p - 1


def build_mtp_head(cfg: MTPConfig, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> MTPHead:
    """Allocated without initialisation (norms at 1), frozen; the loader or the trainer fills the weights."""
    from . import allocate_model  # here: the package imports this module while it discovers architectures

    with torch.device("meta"):
        head = MTPHead(cfg)
    return allocate_model(head.to(dtype=dtype), device).eval()
