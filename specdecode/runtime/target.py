"""What a proposer may use of the target model: the handle the engine gives drafters instead of itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .context import Context, use_context
from .device import kv_dtype
from .kv_cache import KVCache
from .timer import Timer


class ReadOnlyPrefix:
    """A KV-cache stand-in: the committed keys/values [0, start) of one slot of a cache, followed by
    the new ones, which are not written (the cache stays bit-identical). One row per forward."""

    def __init__(self, kv: KVCache, slot: int):
        self.kv, self.slot = kv, slot

    def update(self, layer, k, v, slots, starts, num_new, total_len):
        s, sl = starts[0], self.slot
        return (torch.cat([self.kv.k[layer, sl:sl + 1, :, :s], k], 2),
                torch.cat([self.kv.v[layer, sl:sl + 1, :, :s], v], 2))


@dataclass(frozen=True)
class Target:
    """The target as drafters see it. model: forward(ids, positions) under a Context, compute_logits,
    embed_tokens, cfg; kv: its cache (drafters read it, never write it); name: EngineConfig.model
    (where a drafter looks for its head); kv_cache_dtype, weight_cache: EngineConfig's (a draft model
    is loaded as the target was)."""

    model: Any
    tokenizer: Any
    kv: KVCache
    device: torch.device
    dtype: torch.dtype
    timer: Timer
    name: str
    kv_cache_dtype: str = "auto"
    attention: Any = None  # the AttentionBackend the target runs on (None = the default)
    weight_cache: bool = False

    def kv_dtype(self, quant: str) -> torch.dtype:
        """The cache element type for a drafter model whose linears are ``quant``."""
        return kv_dtype(self.kv_cache_dtype, quant, self.device, self.dtype)

    @torch.inference_mode()
    def hidden_states(self, slot: int, tokens: list[int], start: int, end: int, capture_layers: tuple[int, ...] = ()
                      ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Catches a drafter up on committed positions whose target states it never received (a
        prompt taken from the prefix cache, steps without drafting): the target's final normed states
        [end - start, H] and captured layer outputs {layer: [end - start, H]} of positions start ..
        end - 1 (``tokens[start:end]``), attending the committed keys [0, start) of ``slot`` read-only."""
        ids = torch.tensor([tokens[start:end]], device=self.device)
        pos = torch.arange(start, end, device=self.device)[None]
        ctx = Context(ReadOnlyPrefix(self.kv, slot), [slot], [start], [end - start],
                      capture_layers=tuple(capture_layers), backend=self.attention)
        with use_context(ctx, self.device):
            hidden = self.model(ids, pos)[0]
        return hidden, {i: h[0] for i, h in ctx.captured.items()}
