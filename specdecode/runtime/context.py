"""Per-forward metadata, set by the runner (or a drafter) and read by the attention backend, so that
models keep the plain signature ``forward(input_ids, positions)``.

A forward processes a batch of B sequences, each with its own number of new tokens (padded to T).
Row b owns KV-cache slot ``slots[b]``; it already holds ``starts[b]`` tokens, and its new tokens are
written at cache indices ``starts[b] .. starts[b] + num_new[b] - 1`` whatever their RoPE positions
(tree nodes share positions). Queries see the whole committed prefix plus the new tokens allowed by
``tree_mask`` (default: causal among the new tokens). A drafter whose queries also see uncommitted
entries written by its earlier forwards (EAGLE's tree levels) passes the whole mask as ``attn_mask``."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from typing import Any

from .kv_cache import KVCache


@dataclass
class Context:
    kv: KVCache  # or any object with KVCache.update's signature (a read-only view, see runtime/target.py)
    slots: list[int]
    starts: list[int]
    num_new: list[int]
    # [B, T, T] bool: True where new token i may attend new token j (must hold the diagonal).
    tree_mask: torch.Tensor | None = None
    # Layers whose output hidden states to keep (index i = output of decoder layer i).
    capture_layers: tuple[int, ...] = ()
    captured: dict[int, torch.Tensor] = field(default_factory=dict)
    # Attend query by query, each exactly as a one-token decode of it would (see Attention): set for
    # single-sequence verify forwards, so that with row-invariant linears (the native quantized kernels) verifying a
    # token gives the bits decoding it gives, and greedy speculative output equals plain greedy
    # output on real models too, not only in exact arithmetic.
    row_exact: bool = False
    # [B, 1, T, L] bool (True = attend): derived once per forward by build_attention_mask unless the
    # caller gives it; None = no mask needed.
    attn_mask: torch.Tensor | None = None
    is_causal: bool = False
    mask_given: bool = False  # attn_mask came from the caller (set by build_attention_mask)
    # Derived on first use by row_keys(): per (row, new token) the keys it sees.
    _row_keys: list | None = None
    backend: Any = None  # the AttentionBackend (runtime/attention); None = the default one
    packed: bool = False  # set by a model path that runs only the real rows of a ragged batch (the fused CPU layers)
    native: Any = None  # derived once per forward by the cpu-native backend (its visibility operands)

    def row_keys(self) -> list[list[tuple[int, torch.Tensor | None]]]:
        """[b][j] -> (n, idx): query j of row b sees keys [0, n) when idx is None, else keys idx (a
        tree node: the prefix and its ancestors, in cache order, as the decode of its path has them).
        Read from attn_mask, which every forward with several queries and a cached prefix has."""
        if self._row_keys is None:
            mask = self.attn_mask
            rows = []
            for b, n_new in enumerate(self.num_new):
                row = []
                for j in range(n_new):
                    vis = mask[b, 0, j].cpu()
                    n = int(vis.sum())
                    row.append((n, None) if bool(vis[:n].all()) else (n, vis.nonzero().squeeze(1).to(mask.device)))
                rows.append(row)
            self._row_keys = rows
        return self._row_keys

    @property
    def total_len(self) -> int:
        """Keys attended this forward: max over rows of starts + num_new."""
        return max(s + n for s, n in zip(self.starts, self.num_new))


def build_attention_mask(ctx: Context, device: torch.device) -> None:
    """Fills ctx.attn_mask [B, 1, T, L] (bool, True = attend) or the cheaper is_causal / no-mask cases."""
    if ctx.attn_mask is not None:
        ctx.mask_given = True
        return
    B, T, L = len(ctx.slots), max(ctx.num_new), ctx.total_len
    if B == 1 and ctx.tree_mask is None:
        if T == 1:
            return  # one query sees every cached key
        if ctx.starts[0] == 0:
            ctx.is_causal = True
            return
    starts = torch.tensor(ctx.starts, device=device).view(B, 1, 1)
    n_new = torch.tensor(ctx.num_new, device=device).view(B, 1, 1)
    rel = torch.arange(L, device=device).view(1, 1, L) - starts  # [B, 1, L] key index relative to row start
    qi = torch.arange(T, device=device).view(1, T, 1)
    inside = (rel >= 0) & (rel < n_new)
    if ctx.tree_mask is None:
        new_ok = inside & (rel <= qi)
    else:
        idx = rel.clamp(0, T - 1).expand(B, T, L)
        new_ok = inside & torch.gather(ctx.tree_mask.to(device), 2, idx)
    mask = (rel < 0) | new_ok  # [B, T, L]
    mask[:, :, 0] |= qi.view(1, T) >= n_new.view(B, 1)  # padded query rows: any valid key avoids NaN
    ctx.attn_mask = mask.unsqueeze(1)


_CTX: Context | None = None


def get_context() -> Context:
    assert _CTX is not None, "model forward called outside runtime.context.use_context"
    return _CTX


@contextmanager
def use_context(ctx: Context, device: torch.device):
    global _CTX
    build_attention_mask(ctx, device)
    prev, _CTX = _CTX, ctx
    try:
        yield ctx
    finally:
        _CTX = prev
