"""EAGLE draft heads (Li et al. 2401.15077; EAGLE-3: 2503.01840): one decoder layer on the target's
hidden states, predicting the token after next.

Entry j of the head pairs the target's state at position j with the embedding of token j+1 and
predicts token j+2 (so the entry of the last committed position drafts the token after the root):
  EAGLE-3: g = fc(concat[h_low, h_mid, h_high])            [.., 3H_t] -> [.., H]
           a = attn(concat[input_layernorm(e), hidden_norm(g)])   q/k/v read 2H; residual = g
           x = (g + a) + mlp(post_attention_layernorm(g + a))      the pre-norm output
           logits = lm_head(norm(x)) over a reduced draft vocabulary; target_id = id + d2t[id]
  EAGLE-1: u = fc(concat[e, h_last]); x = the same layer on u (no input norm); logits = target head(x)
Steps after the first feed x back in place of g (EAGLE-3) / h_last (EAGLE-1).
Module names follow the published HF layout (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``,
``t2d``), so a state_dict is a checkpoint. The embedding (and EAGLE-1's LM head) is the target's,
bound with ``bind``; a checkpoint that ships its own ``embed_tokens`` overrides it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import native_kernels
from ..layers.norm import RMSNorm
from ..layers.rotary import RotaryEmbedding, apply_rotary
from ..runtime.attention import attention, backend
from ..runtime.context import get_context
from .config import RopeScaling
from .eagle_native import NativeStep


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low/mid/high taps as *outputs* of decoder layers (our capture index). vLLM and SGLang
    default to the inputs of layers (2, L//2, L-3), i.e. the outputs of layers (1, L//2-1, L-4); models
    too shallow for that (tests) use the first, middle and last layers."""
    if num_layers < 8:
        return (0, num_layers // 2, num_layers - 1)
    return (1, num_layers // 2 - 1, num_layers - 4)


@dataclass(frozen=True)
class EagleConfig:
    kind: str  # "eagle3" | "eagle"
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # EAGLE-3's reduced vocabulary (= vocab_size for EAGLE-1)
    target_hidden_size: int
    aux_layers: tuple[int, ...] = ()  # EAGLE-3 taps: outputs of these target layers, low to high
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    norm_before_residual: bool = False  # EAGLE-3 variant: residual = hidden_norm(g)
    attention_bias: bool = False
    fc_bias: bool = False  # EAGLE-1 (SafeAILab) checkpoints carry fc.bias
    verifier: str = ""  # the target the head was trained for (informational)


class _Attn(nn.Module):
    def __init__(self, cfg: EagleConfig, in_features: int):
        super().__init__()
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(in_features, h * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(in_features, kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(in_features, kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.qkv_proj: nn.Module | None = None  # q, k, v rows in one layer (EagleHead.quantize)
        self.sizes = [h * d, kv * d, kv * d]  # qkv_proj's output split into q, k, v

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.qkv_proj(x).split(self.sizes, dim=-1)


class _MLP(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Module | None = None  # gate, up rows in one layer (EagleHead.quantize)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gu = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        else:
            gu = self.gate_up_proj(x)
        nk = native_kernels()
        # drafting on CPU in float32: the native silu x up, as the fused step (eagle_native.py) and the
        # target's SwiGLU run it, so that the fused and module paths (and a quantized head's fused
        # gate / up beside separate ones) give the same bits
        if (nk is not None and gu.dtype == torch.float32 and gu.device.type == "cpu"
                and self.down_proj.in_features % 8 == 0 and not (torch.is_grad_enabled() and gu.requires_grad)):
            return self.down_proj(nk.silu_mul(gu.contiguous()))
        gate, up = gu.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class _MidLayer(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        H = cfg.hidden_size
        eagle3 = cfg.kind == "eagle3"
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps) if eagle3 else None
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps) if eagle3 else None
        self.self_attn = _Attn(cfg, 2 * H if eagle3 else H)
        self.post_attention_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.mlp = _MLP(cfg)


class EagleHead(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        if cfg.kind not in ("eagle3", "eagle"):
            raise ValueError(f"unknown EAGLE head kind {cfg.kind!r}")
        self.cfg = cfg
        H = cfg.hidden_size
        eagle3 = cfg.kind == "eagle3"
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.target_hidden_size if eagle3 else 2 * H, H, bias=cfg.fc_bias)
        self.midlayer = _MidLayer(cfg)
        self.norm = RMSNorm(H, cfg.rms_norm_eps) if eagle3 else None
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False) if eagle3 else None
        self.embed_tokens: nn.Embedding | None = None  # set only when a checkpoint ships its own
        if eagle3:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self._target: tuple = ()  # (target model,): a plain tuple so it is neither a submodule nor saved
        self._native = NativeStep()  # the step as one native call where it applies (CPU drafting)

    def bind(self, target) -> "EagleHead":
        """Shares the target's embedding (and, for EAGLE-1, its LM head)."""
        self._target = (target,)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.midlayer.post_attention_layernorm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.midlayer.post_attention_layernorm.weight.device

    def quantize(self, fmt: str = "int8") -> "EagleHead":
        """Weight-only quantized projections, in place, for CPU drafting: ``int8`` (one scale per output
        row) or ``int4`` (groups of 32, the target's int4 format, where a matrix's shape allows it; int8
        otherwise). Drafting steps are memory-bound: a 1.5B's head streams ~30 MB of int8 weights per
        tree level (its weights do not stay cached beside the target's), and int4 halves that. Drafts
        only get cheaper or slightly different; verification keeps the output exact. q / k / v and
        gate / up become one layer each (``qkv_proj``, ``gate_up_proj``, as in the target): a drafting
        step runs after the target's weights have streamed through every cache, where each call costs
        ~0.1 ms of cold Python and setup besides its weights; both formats scale each output row (int4:
        each group of a row) on its own, so every output keeps the bits the separate layers give."""
        from ..layers.quant import Int8Linear
        from ..layers.quant.int4 import GROUP, Int4Linear

        if fmt not in ("int8", "int4"):
            raise ValueError(f"unknown head format {fmt!r} (int8, int4)")

        def quantized(*linears: nn.Linear):
            w = torch.cat([m.weight.detach().float() for m in linears])
            bias = None if linears[0].bias is None else torch.cat([m.bias.detach().float() for m in linears])
            if fmt == "int4" and w.shape[1] % GROUP == 0 and w.shape[0] % 16 == 0:
                return Int4Linear.from_float(w, bias, group_size=GROUP)
            return Int8Linear.from_float(w, bias)

        a, mlp = self.midlayer.self_attn, self.midlayer.mlp
        if a.qkv_proj is None:
            a.qkv_proj = quantized(a.q_proj, a.k_proj, a.v_proj)
            del a.q_proj, a.k_proj, a.v_proj
        if mlp.gate_up_proj is None:
            mlp.gate_up_proj = quantized(mlp.gate_proj, mlp.up_proj)
            del mlp.gate_proj, mlp.up_proj
        for module in (self, a, mlp):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, quantized(child))
        return self

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.aux_layers) if self.cfg.kind == "eagle3" else ()

    # -- pieces ----------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        emb = self.embed_tokens if self.embed_tokens is not None else self._target[0].embed_tokens
        return emb(ids).to(self.dtype)

    def features(self, final: torch.Tensor, captured: dict[int, torch.Tensor]) -> torch.Tensor:
        """The target's state per position: EAGLE-3 [.., 3H_t] (taps low..high), EAGLE-1 [.., H] (normed last)."""
        if self.cfg.kind == "eagle3":
            return torch.cat([captured[i] for i in self.cfg.aux_layers], dim=-1)
        return final

    @property
    def feature_size(self) -> int:
        """The width of ``features``."""
        return self.cfg.target_hidden_size * (len(self.cfg.aux_layers) if self.cfg.kind == "eagle3" else 1)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features -> the hidden input of the first step (EAGLE-1 fuses later, in ``layer``)."""
        return self.fc(feats.to(self.dtype)) if self.cfg.kind == "eagle3" else feats.to(self.dtype)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """embeds, hidden [B, T, H], positions [B, T] -> q [B, h, T, D], k, v [B, hkv, T, D], residual [B, T, H]."""
        m, c = self.midlayer, self.cfg
        if c.kind == "eagle3":
            g = m.hidden_norm(hidden)
            residual = g if c.norm_before_residual else hidden
            x = torch.cat([m.input_layernorm(embeds), g], dim=-1)
        else:
            x = residual = self.fc(torch.cat([embeds, hidden], dim=-1))
        B, T, _ = x.shape
        cos, sin = self.rotary(positions, x.dtype)
        q, k, v = m.self_attn.qkv(x)
        q = apply_rotary(q.reshape(B, T, c.num_heads, c.head_dim).transpose(1, 2), cos, sin)
        k = apply_rotary(k.reshape(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2), cos, sin)
        v = v.reshape(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return q, k, v, residual

    def finish(self, o: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Attention output o [B, h, T, D] -> the layer's pre-norm output [B, T, H]."""
        m = self.midlayer
        B, _, T, _ = o.shape
        h = residual + m.self_attn.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        return h + m.mlp(m.post_attention_layernorm(h))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-norm output [.., H] -> float32 logits over the draft vocabulary [.., V_draft]."""
        if self.cfg.kind == "eagle3":
            return self.lm_head(self.norm(x)).float()
        return self._target[0].compute_logits(x.to(self._target[0].dtype))

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids] if self.cfg.kind == "eagle3" else draft_ids

    # -- forwards --------------------------------------------------------------------------------
    def step(self, embeds, hidden, positions) -> torch.Tensor:
        """One incremental forward over the forward context's cache (runtime/context.py; the head's
        cache has one layer): row b writes its num_new[b] entries at cache index starts[b] (nothing
        is committed) and its queries see the keys the context's mask allows. embeds, hidden
        [B, T, H], positions [B, T] -> the pre-norm output [B, T, H]."""
        fused = self._native.step(self, get_context(), embeds, hidden, positions)
        if fused is not None:
            return fused
        q, k, v, residual = self.qkv(embeds, hidden, positions)
        return self.finish(attention(0, q, k, v), residual)

    def forward_reference(self, feats: torch.Tensor, next_ids: torch.Tensor, steps: int = 1) -> list[torch.Tensor]:
        """Straightforward full-sequence drafting, for tests: feats [T, F] of positions 0..T-1, next_ids
        [T] = tokens 1..T. Step 1 is causal attention over the T entries; each later step s appends, for
        every origin t, one entry (its own previous output, its own greedy token) at position t + s - 1
        that sees the origin's causal prefix and its own chain, like a chain draft from each t.
        Returns the draft-vocab logits [T, V_draft] of each step."""
        T = feats.shape[0]
        pos = torch.arange(T)
        q, k, v, res = self.qkv(self.embed(next_ids)[None], self.project(feats)[None], pos[None])
        x = self.finish(backend().attend(q, k, v, causal=True), res)
        keys, values, out = [k], [v], [self.logits(x)[0]]
        for s in range(1, steps):
            ids = self.to_target(out[-1].argmax(-1))
            q, k, v, res = self.qkv(self.embed(ids)[None], x, (pos + s)[None])
            keys.append(k)
            values.append(v)
            o = torch.empty_like(q)
            for t in range(T):  # origin t sees keys 0..t of step 1 and its own entries of steps 2..s+1
                kt = torch.cat([keys[0][:, :, :t + 1]] + [kk[:, :, t:t + 1] for kk in keys[1:]], dim=2)
                vt = torch.cat([values[0][:, :, :t + 1]] + [vv[:, :, t:t + 1] for vv in values[1:]], dim=2)
                o[:, :, t:t + 1] = backend().attend(q[:, :, t:t + 1], kt, vt)
            x = self.finish(o, res)
            out.append(self.logits(x)[0])
        return out


def init_head(cfg: EagleConfig, seed: int = 0, std: float = 0.02) -> EagleHead:
    """A freshly initialised head (training start; tests): normal(0, std) weights, unit norms."""
    g = torch.Generator().manual_seed(seed)
    head = EagleHead(cfg)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return head

