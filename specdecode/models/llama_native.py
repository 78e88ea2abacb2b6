"""LlamaModel's decoder layers as one native call per forward (kernels/layer.c), for CPU inference.

The fused path runs a forward only where it gives the same bits as the module path: the
cpu-native attention backend over a KVCache, float32 activations, and every projection a native
int4 or int8 layer (layers/quant). Anywhere else (another backend, float weights, training,
another device) ``NativeForward.begin`` returns None and the modules run as usual."""
from __future__ import annotations

import ctypes
import weakref

import torch

from ..kernels import native_kernels
from ..kernels.layer import LayerOperands, SdBatch, linear_operands
from ..layers.quant.int4 import Int4Linear
from ..layers.quant.int8 import Int8Linear
from ..runtime.attention.native_cpu import NativeCPUBackend, visibility
from ..runtime.context import Context

LEAN_ROWS = 16  # the most new tokens few_tokens takes: a decode step, a draft model's step, a short verify


def native_linear(m) -> tuple | None:
    """(SdLinear, tensors it points into) for a native quantized layer with a float32 bias or none,
    else None."""
    bias = m.bias
    if bias is not None and bias.dtype != torch.float32:
        return None
    if isinstance(m, Int4Linear) and m.kernel == "native":
        sub, sup = m.qparams, m.qsuper  # sub-scales and super-scales (kernels.store_int4_scales), contiguous
        keep = [m.qweight, sub, sup, bias]
        return linear_operands(4, m.in_features, m.out_features, m.group_size, m.qweight, sub, sup, bias), keep
    if isinstance(m, Int8Linear) and m.kernel == "native":
        keep = [m.qweight, m.scales, bias]
        return linear_operands(8, m.in_features, m.out_features, 32, m.qweight, m.scales, None, bias), keep
    return None


def _layer(layer, cfg) -> LayerOperands | None:
    attn, mlp = layer.self_attn, layer.mlp
    norms = [layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm]
    if any(n is not None and (n.weight.dtype != torch.float32 or not n.weight.is_contiguous()) for n in norms):
        return None
    lins = [native_linear(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if any(lin is None for lin in lins):
        return None
    keep = [t for lin in lins for t in lin[1] if t is not None]
    return LayerOperands((cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size),
                         cfg.rms_norm_eps, [None if n is None else n.weight.detach() for n in norms],
                         [lin[0] for lin in lins], keep)


class NativeForward:
    """The fused path of one LlamaModel: per-layer operands, built on first use."""

    def __init__(self, model):
        self.model = model
        self._ops: list[LayerOperands] | None = None
        self._key = None
        self._structs = None  # ctypes array: the address of each layer's sd_layer
        self._caches = (None, None, None)  # (key, kc, vc): each layer's cache addresses in one KV cache
        # few_tokens' operands over each KV cache it ran on (two engines may share one model), kept between
        # forwards; weak: a cache dropped by its engine drops them
        self._lean: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _operands(self) -> list[LayerOperands] | None:
        layers = self.model.layers
        first = getattr(layers[0].self_attn.qkv_proj, "qweight", None)
        last = getattr(layers[-1].mlp.down_proj, "qweight", None)
        if first is None or last is None:  # float weights
            return None
        # the weights' addresses: a model moved or re-allocated since the operands were built rebuilds them
        key = (first.data_ptr(), last.data_ptr())
        if key != self._key:
            cfg = self.model.cfg
            ops = [_layer(layer, cfg) for layer in layers]
            self._ops = None if any(o is None for o in ops) else ops
            self._key = key
            if self._ops is not None:
                self._structs = (ctypes.c_void_p * len(ops))(*[ctypes.addressof(o.struct) for o in ops])
        return self._ops

    def _cache_addresses(self, kv) -> tuple[ctypes.Array, ctypes.Array]:
        """Arrays of layer i's key and value cache addresses (kv.k[i], kv.v[i]), built once per cache."""
        key = (kv.k.data_ptr(), kv.v.data_ptr(), kv.k.shape)
        if self._caches[0] != key:
            n = kv.k.shape[0]
            arrays = [(ctypes.c_void_p * n)(*[t.data_ptr() + i * t.stride(0) * t.element_size() for i in range(n)])
                      for t in (kv.k, kv.v)]
            self._caches = (key, *arrays)
        return self._caches[1], self._caches[2]

    def _fused(self, backend, kv, dtype: torch.dtype, device: torch.device) -> list[LayerOperands] | None:
        """The layers' operands where the fused path takes a forward on ``backend`` over ``kv`` with
        activations of dtype on device, else None."""
        cfg = self.model.cfg
        if (not isinstance(backend, NativeCPUBackend) or dtype != torch.float32
                or cfg.hidden_size % 8 or cfg.intermediate_size % 8 or cfg.head_dim % 2
                or not NativeCPUBackend.runs(kv, device, cfg.head_dim, cfg.num_heads // cfg.num_kv_heads)):
            return None
        return self._operands()

    def begin(self, ctx: Context, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> "Batch | None":
        """The fused path for this forward (x [B, T, hidden], cos / sin [B, 1, T, D]), or None."""
        if torch.is_grad_enabled() and x.requires_grad:
            return None
        ops = self._fused(ctx.backend, ctx.kv, x.dtype, x.device)
        if ops is None:
            return None
        ctx.packed = True
        return Batch(ops, ctx, x, cos, sin, self._structs, self._cache_addresses(ctx.kv))

    def few_tokens(self, kv, backend, slot: int, tokens: list[int], positions: list[int],
                   tree_mask: torch.Tensor | None = None, capture: tuple[int, ...] = ()
                   ) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """The decoder layers and final norm over T <= LEAN_ROWS new tokens of one sequence (written at
        cache indices kv.lengths[slot] onwards, RoPE ``positions``; tree_mask [T, T] bool among them,
        None for a chain), as forward runs them for B = 1: (hidden [1, T, H] normed, {layer i in
        capture: its output [1, T, H]}); None where the fused path does not apply (``begin``'s
        conditions) or T is larger."""
        model = self.model
        if not 0 < len(tokens) <= LEAN_ROWS:
            return None
        ops = self._fused(backend, kv, model.dtype, model.device)
        if ops is None:
            return None
        lean = self._lean.get(kv)
        if lean is None or lean.ops is not ops:
            lean = self._lean[kv] = _Lean(model, ops, self._structs, self._cache_addresses(kv), kv)
        return lean.run(kv, model, slot, tokens, positions, tree_mask, capture)


def capture_pointers(n: int, bufs: dict[int, torch.Tensor]) -> ctypes.Array | None:
    """The native decoder_layers' capture argument for layers 0 .. n - 1: bufs[i]'s address at entry i
    (each a contiguous float32 tensor of the activation's shape), NULL elsewhere; None for no buffers."""
    if not bufs:
        return None
    out = (ctypes.c_void_p * n)()
    for i, b in bufs.items():
        out[i] = b.data_ptr()
    return out


class Batch:
    """One forward's sd_batch, scratch and cache addresses (structs, caches: the layers' SdLayer and
    cache address arrays for ``layers``; an EAGLE-3 head's one layer passes its own, eagle_native.py).

    A ragged batch (rows with fewer new tokens than the longest, as when drafts of different lengths
    are verified together) runs its layers on the packed rows only: x [N, hidden] with N = sum of
    num_new, so that padding costs nothing in the matrices. Every row's result is the same either way
    (the native kernels are row-invariant)."""

    def __init__(self, ops: list[LayerOperands], ctx: Context, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 structs: ctypes.Array | None = None, caches: tuple[ctypes.Array, ctypes.Array] | None = None):
        nk = native_kernels()
        kv = ctx.kv
        B, T, _ = x.shape
        kv.clean(ctx.slots, ctx.total_len)
        nkeys, mask, slots = visibility(ctx)
        self.starts = torch.tensor(ctx.starts, dtype=torch.int32)
        self.num_new = torch.tensor(ctx.num_new, dtype=torch.int32)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        self.keep = (nkeys, mask, slots)
        # pos [N]: flat index b T + t of each packed row; None when no row is padded
        self.shape, self.pos = (B, T), None
        if sum(ctx.num_new) < B * T:
            self.pos = torch.tensor([b * T + t for b, n in enumerate(ctx.num_new) for t in range(n)], dtype=torch.int32)
        N = B * T if self.pos is None else len(self.pos)
        D = kv.k.shape[-1]
        self.batch = SdBatch(B, T, N, None if self.pos is None else self.pos.data_ptr(), slots.data_ptr(),
                             self.starts.data_ptr(), self.num_new.data_ptr(), nkeys.data_ptr(),
                             None if mask is None else mask.data_ptr(), 0 if mask is None else mask.shape[-1],
                             self.cos.data_ptr(), self.sin.data_ptr(), int(kv.k.dtype == torch.bfloat16), kv.k.shape[3],
                             D ** -0.5)
        self.ops, self.structs, self.caches = ops, structs, caches
        self.scratch = nk.layer_scratch(ops[0].struct, B * T)
        self.nk = nk

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] -> a new contiguous tensor of the rows the layers run on: [N, hidden]
        when the batch is ragged, else [B, T, hidden]."""
        if self.pos is None:
            return x.contiguous().clone()
        return x.reshape(-1, x.shape[-1])[self.pos.long()].contiguous()

    def unpack(self, x: torch.Tensor, copy: bool = False) -> torch.Tensor:
        """The inverse of pack: [B, T, hidden], padding rows zero; a new tensor when packed or copy,
        else x itself."""
        if self.pos is None:
            return x.clone() if copy else x
        out = x.new_zeros(*self.shape, x.shape[-1])
        out.view(-1, x.shape[-1])[self.pos.long()] = x
        return out

    def layers(self, x: torch.Tensor, capture: dict[int, torch.Tensor]) -> None:
        """x float32 contiguous (from pack), owned by the caller, becomes the output of the decoder layers,
        run in one native call; capture {layer: a tensor shaped as x}: each receives that layer's output."""
        n = len(self.ops)
        self.nk.decoder_layers(self.structs, *self.caches, 0, n, self.batch, x, self.scratch,
                               capture_pointers(n, capture))


class _Lean:
    """One sequence's forward of a few tokens (a plain decode step, a draft model's step, the verify
    of a short draft) through the fused layers, its sd_batch, int32 operands, scratch and input rows
    kept from forward to forward: a step sets a few numbers and pointers instead of building a Context,
    a Batch and their tensors. After the weights have streamed through the caches, every object the
    general path touches is a cache miss: its Python costs a step ~0.5-0.9 ms more. The layers receive
    what forward gives them for B = 1 (the same embedding rows, the same rows of the rotary tables,
    the same visibility, the same kernels), so the bits are the same."""

    def __init__(self, model, ops: list[LayerOperands], structs: ctypes.Array,
                 caches: tuple[ctypes.Array, ctypes.Array], kv):
        self.ops, self.structs, self.caches = ops, structs, caches  # caches: kv's layer addresses (never kv)
        self.nk = native_kernels()
        # slot, start (tokens cached), num_new = T, then nkeys [T]: query t sees keys [0, nkeys[t])
        self.ints = (ctypes.c_int32 * (3 + LEAN_ROWS))()
        base, w = ctypes.addressof(self.ints), ctypes.sizeof(ctypes.c_int32)
        D = kv.k.shape[-1]
        self.batch = SdBatch(1, 1, 1, None, base, base + w, base + 2 * w, base + 3 * w, None, 0, None, None,
                             int(kv.k.dtype == torch.bfloat16), kv.k.shape[3], D ** -0.5)
        self.scratch = self.nk.layer_scratch(ops[0].struct, LEAN_ROWS)
        self.x = torch.empty(LEAN_ROWS, ops[0].struct.hidden)  # the layers' activation rows, updated in place
        self.rot = torch.empty(2, LEAN_ROWS, D)  # cos, sin rows of a forward whose positions are not consecutive
        self.norm = model.norm.native_operands()  # RMSNorm.forward's native call on x; None: the module runs

    def run(self, kv, model, slot: int, tokens: list[int], positions: list[int], tree_mask: torch.Tensor | None,
            capture: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        T, start = len(tokens), kv.lengths[slot]
        kv.clean([slot], start + T)
        p0 = positions[0]
        cos, sin = model.rotary.tables(max(positions) + 1, torch.float32, model.device)  # float32 [n, D] each
        batch, ints = self.batch, self.ints
        if positions == list(range(p0, p0 + T)):
            row = cos.stride(0) * cos.element_size() * p0  # consecutive: the tables' own rows
            batch.cos, batch.sin = cos.data_ptr() + row, sin.data_ptr() + row
        else:  # tree nodes share positions: their rows gathered
            idx = torch.tensor(positions)
            rot = self.rot
            torch.index_select(cos, 0, idx, out=rot[0, :T])
            torch.index_select(sin, 0, idx, out=rot[1, :T])
            batch.cos, batch.sin = rot[0].data_ptr(), rot[1].data_ptr()
        ints[0], ints[1], ints[2] = slot, start, T
        mask = None
        if tree_mask is None:  # causal: query t sees the prefix and new tokens 0..t
            for t in range(T):
                ints[3 + t] = start + t + 1
        else:  # visibility()'s operands for this row: the prefix, then the tree's mask among the new keys
            mask = torch.ones(T, start + T, dtype=torch.uint8)
            mask[:, start:] = tree_mask
            for t in range(T):
                ints[3 + t] = start + int(tree_mask[t].nonzero().max()) + 1
        batch.mask, batch.Lm = (None, 0) if mask is None else (mask.data_ptr(), start + T)
        batch.T = batch.N = T
        emb = model.embed_tokens
        x = self.x[:T]
        if hasattr(emb, "row"):
            for t, tok in enumerate(tokens):
                x[t].copy_(emb.row(tok))
        else:
            x.copy_(emb(torch.tensor([tokens]))[0])
        n = len(self.ops)
        captured = {i: torch.empty(1, T, x.shape[-1]) for i in capture if 0 <= i < n}
        self.nk.decoder_layers(self.structs, *self.caches, 0, n, batch, x, self.scratch,
                               capture_pointers(n, captured))
        if self.norm is None:
            return model.norm(x.view(1, T, -1)), captured
        return self.nk.rmsnorm(x, *self.norm).view(1, T, -1), captured
