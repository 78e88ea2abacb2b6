"""Prefix caching over the slot KV cache: a finished sequence's slot keeps its keys and values.

A freed slot still holds the KV of the tokens it last committed (freeing only resets the length), so
a new request whose prompt starts with those tokens (same system prompt, the next turn of a chat) can
take that slot and skip prefilling the common prefix. Positions match, so the reused entries are
exactly what a fresh prefill would compute: greedy output does not change.

Bookkeeping is one token list per slot, recorded when the slot is released. Whoever else allocates
a slot of the same KV cache and writes into it (the engine's cost calibration) must ``invalidate`` it.
"""
from __future__ import annotations

import itertools

from ..runtime.kv_cache import KVCache


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    def __init__(self, kv: KVCache):
        self.kv = kv
        self.cached: dict[int, list[int]] = {}  # slot -> tokens whose KV the (free) slot holds
        self._released_at: dict[int, int] = {}  # slot -> release order, for least-recently-used eviction
        self._clock = itertools.count()
        self.queries = 0  # admissions that looked up the cache
        self.hits = 0  # admissions that reused at least one token
        self.prompt_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # prompt tokens whose prefill was skipped

    def allocate(self, prompt_ids: list[int]) -> tuple[int, int]:
        """Takes the free slot sharing the longest prefix with the prompt (ties and misses: the least
        recently used one) and returns (slot, reused). The slot's committed length is set to
        ``reused``; at least the last prompt token is left out, as it is the first draft root."""
        free = self.kv.free_slot_ids()[::-1]  # in the order plain allocation hands them out (ties go first)
        if not free:
            return self.kv.allocate(), 0  # raises the KV cache's own "no free slot" error
        matches = {s: common_prefix_len(self.cached.get(s, []), prompt_ids) for s in free}
        slot = self.kv.allocate(max(free, key=lambda s: (matches[s], -self._released_at.get(s, -1))))
        reused = min(matches[slot], len(prompt_ids) - 1)
        self.cached.pop(slot, None)
        self.kv.set_length(slot, reused)
        self.queries += 1
        self.hits += reused > 0
        self.prompt_tokens += len(prompt_ids)
        self.hit_tokens += reused
        return slot, reused

    def release(self, slot: int, tokens: list[int]) -> None:
        """Called just before ``kv.free(slot)``: remembers which tokens the slot's KV holds. Entries
        past the committed length (rejected drafts) are stale and not recorded; committed entries past
        ``tokens`` (drafts accepted after a stop condition, then dropped) are unknown and not recorded."""
        n = min(self.kv.lengths[slot], len(tokens))
        self.cached[slot] = list(tokens[:n])
        self._released_at[slot] = next(self._clock)

    def invalidate(self, slot: int) -> None:
        self.cached.pop(slot, None)

    def clear(self) -> None:
        self.cached.clear()
