"""An EAGLE-3 head's step as one native call (kernels/layer.c's specdecode_eagle3_layer), for CPU drafting.

A head step is one decoder layer over one to a few rows, and driving its ~15 modules from Python costs
about what its weights' stream does (~1 ms a step on a 2-core CPU against ~0.7 ms of GEMMs), in every
drafting step. Where the fused path applies (float32 activations on the CPU, the cpu-native attention
backend over the head's KVCache, every projection a native int4 or int8 layer, as EagleHead.quantize
leaves them) it gives the bits of the module path (EagleHead.qkv / finish: the same native RMSNorm,
GEMMs, RoPE arithmetic, attention and silu x up); elsewhere ``step`` returns None and the modules run."""
from __future__ import annotations

import torch

from ..kernels import native_kernels
from ..kernels.layer import LayerOperands
from ..runtime.attention.native_cpu import NativeCPUBackend
from ..runtime.context import Context
from .llama_native import Batch, native_linear


class NativeStep:
    """The fused step of one EagleHead: its layer's operands, built on first use (and again if the
    head's weights move)."""

    def __init__(self):
        self._ops: LayerOperands | None = None
        self._key = None

    def _operands(self, head) -> LayerOperands | None:
        m, c = head.midlayer, head.cfg
        a, mlp = m.self_attn, m.mlp
        if c.kind != "eagle3" or a.qkv_proj is None or mlp.gate_up_proj is None:
            return None
        norms = [m.hidden_norm, m.post_attention_layernorm, m.input_layernorm]
        # the operands point into these tensors: a head whose weights moved or were replaced rebuilds them
        key = tuple(t.data_ptr() if t is not None else None for t in
                    [getattr(x, "qweight", None) for x in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)]
                    + [n.weight for n in norms])
        if key == self._key:
            return self._ops
        self._key, self._ops = key, None
        lins = [native_linear(x) for x in (a.qkv_proj, a.o_proj, mlp.gate_up_proj, mlp.down_proj)]
        if (any(lin is None for lin in lins) or c.hidden_size % 8 or c.intermediate_size % 8 or c.head_dim % 2
                or any(n.weight.dtype != torch.float32 or not n.weight.is_contiguous() for n in norms)):
            return None
        hidden_norm, post, embed_norm = (n.weight.detach() for n in norms)
        self._ops = LayerOperands((c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size),
                                  c.rms_norm_eps, [hidden_norm, post, None, None], [lin[0] for lin in lins],
                                  [t for lin in lins for t in lin[1] if t is not None], embed_norm=embed_norm,
                                  norm_residual=c.norm_before_residual)
        return self._ops

    def step(self, head, ctx: Context, embeds: torch.Tensor, hidden: torch.Tensor,
             positions: torch.Tensor) -> torch.Tensor | None:
        """EagleHead.step's output [B, T, H] (embeds, hidden [B, T, H], positions [B, T]) in one native
        call, writing the new entries to the context's cache as the module path does; None where the
        fused path does not apply."""
        c = head.cfg
        # with autograd on, the module path keeps PyTorch's norms where a weight or input wants a gradient
        # (training): the fused path runs under no_grad / inference_mode, as drafting does
        if (hidden.dtype != torch.float32 or embeds.dtype != torch.float32 or hidden.device.type != "cpu"
                or torch.is_grad_enabled()
                or not isinstance(ctx.backend, NativeCPUBackend)
                or not NativeCPUBackend.runs(ctx.kv, hidden.device, c.head_dim, c.num_heads // c.num_kv_heads)):
            return None
        ops = self._operands(head)
        if ops is None:
            return None
        cos, sin = head.rotary(positions, hidden.dtype)  # [B, 1, T, D]
        kv = ctx.kv
        fused = Batch([ops], ctx, hidden, cos, sin)
        x, e = fused.pack(hidden), fused.pack(embeds)  # x: the residual stream, updated in place
        native_kernels().eagle3_layer(ops.struct, kv.k.data_ptr(), kv.v.data_ptr(), fused.batch, x, e, fused.scratch)
        return fused.unpack(x)
