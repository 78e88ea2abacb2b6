"""What an EAGLE head's work costs on this machine, measured once on a scratch slot of its KV cache: a
tree level for a batch (the controller's draft cost per level) and an entry of a bulk feed (a prompt's
or a catch-up's, priced by catch_up_cost)."""
from __future__ import annotations

import torch

from ..models.eagle import EagleHead
from ..runtime.context import Context, use_context
from ..runtime.kv_cache import KVCache
from ..runtime.timer import Timer


@torch.inference_mode()
def level_cost(h: EagleHead, kv: KVCache, attention, timer: Timer, n_seqs: int, K: int) -> float:
    """Seconds of one tree level for n_seqs rows (K entries each over a 32-entry prefix)."""
    dev = h.device
    x = torch.zeros(n_seqs, K, h.cfg.hidden_size, dtype=h.dtype, device=dev)
    ids = torch.zeros(n_seqs, K, dtype=torch.long, device=dev)
    pos = torch.full((n_seqs, K), 32, device=dev)
    with kv.scratch_slot() as slot:
        ctx = Context(kv, [slot] * n_seqs, [32] * n_seqs, [K] * n_seqs,
                      attn_mask=torch.ones(n_seqs, 1, K, 32 + K, dtype=torch.bool, device=dev), backend=attention)
        with use_context(ctx, dev):
            return timer.best_of(lambda: h.logits(h.step(h.embed(ids), x, pos)).topk(K, dim=-1))


@torch.inference_mode()
def entry_cost(h: EagleHead, kv: KVCache, attention, timer: Timer, n: int = 64) -> float:
    """Seconds per entry of a bulk feed: n causal entries, as EagleProposer._feed_pending runs them."""
    dev = h.device
    feats = torch.zeros(1, n, h.feature_size, dtype=h.dtype, device=dev)
    ids = torch.zeros(1, n, dtype=torch.long, device=dev)
    pos = torch.arange(n, device=dev)[None]
    with kv.scratch_slot() as slot:
        ctx = Context(kv, [slot], [0], [n], backend=attention)
        with use_context(ctx, dev):
            return timer.best_of(lambda: h.step(h.embed(ids), h.project(feats), pos), reps=2) / n
