"""The CPU default: batch-invariant attention in native code (kernels/attention.c).

Every query is attended on its own, in an order fixed by the keys it sees, so a token gets the same
bits whether it is prefilled in a chunk, decoded alone, verified among draft tokens or run in a batch
beside other sequences. With the row-invariant native linears this makes greedy output independent
of load (batching), of history (prefix-cache rows written by decode or by prefill) and of speculation,
and it makes every verify forward exact without ``row_exact``'s per-query calls.

Where the kernel cannot run (no native library, a cache in float16, a head dimension it does not
take, a cache object that is not a KVCache, such as a drafter's read-only view of the target's cache),
the forward falls back to PyTorch's SDPA (TorchSDPABackend), which is correct but not batch-invariant.
"""
from __future__ import annotations

import torch

from ...kernels import native_kernels
from ..context import Context
from ..kv_cache import KVCache
from .torch_sdpa import TorchSDPABackend


class NativeCPUBackend(TorchSDPABackend):
    name = "cpu-native"

    @staticmethod
    def available() -> bool:
        return native_kernels() is not None

    @staticmethod
    def runs(kv, device: torch.device, head_dim: int, group: int) -> bool:
        """Whether the kernel takes a forward over ``kv`` (the context's cache): queries of head_dim on
        device, ``group`` query heads per kv head (else forward falls back to SDPA)."""
        return (native_kernels() is not None and type(kv) is KVCache and device.type == "cpu"
                and kv.k.dtype in (torch.bfloat16, torch.float32) and head_dim % 8 == 0 and head_dim <= 256
                and group <= 64)

    def forward(self, layer, q, k, v, ctx: Context):
        kv = ctx.kv
        if not self.runs(kv, q.device, q.shape[-1], q.shape[1] // k.shape[1]):
            return super().forward(layer, q, k, v, ctx)
        nk = native_kernels()
        kv.write(layer, k, v, ctx.slots, ctx.starts, ctx.num_new, ctx.total_len)
        nkeys, mask, slots = visibility(ctx)
        o = nk.attention(q.float().contiguous(), kv.k[layer], kv.v[layer], slots, nkeys, mask)
        return o.to(q.dtype)


def visibility(ctx: Context) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Per forward (cached on the context, shared by its layers): nkeys int32 [B, T] (query t of row b
    sees keys [0, nkeys)), mask uint8 [B, T, L] or None (within that range, which keys), slots int32 [B].
    Padded queries (t >= num_new[b]) see key 0 only: finite, unused."""
    if ctx.native is None:
        B, T = len(ctx.slots), max(ctx.num_new)
        slots = torch.tensor(ctx.slots, dtype=torch.int32)
        if ctx.tree_mask is None and not ctx.mask_given:  # causal chains (decode, prefill): no mask needed
            nkeys = torch.tensor([[s + t + 1 if t < n else 1 for t in range(T)]
                                  for s, n in zip(ctx.starts, ctx.num_new)], dtype=torch.int32)
            mask = None
        else:  # trees and caller-given masks [B, 1, T, L]: a query sees up to its last visible key
            m = ctx.attn_mask[:, 0].to("cpu", torch.uint8).contiguous()
            L = m.shape[-1]
            last = torch.where(m.bool(), torch.arange(1, L + 1, dtype=torch.int32), 0).amax(-1)
            nkeys, mask = last.to(torch.int32).clamp_min(1).contiguous(), m
        ctx.native = (nkeys, mask, slots)
    return ctx.native
