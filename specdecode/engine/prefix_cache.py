"""Prefix caching over the slot KV cache: a finished sequence's slot keeps its keys and values.

A freed slot still holds the KV of the tokens it last committed (freeing only resets the length), so
a new request whose prompt starts with those tokens (same system prompt, the next turn of a chat) can
take that slot and skip prefilling the common prefix. Positions match, so the reused entries are
exactly what a fresh prefill would compute: greedy output does not change. When such a slot is about
to be overwritten, its tokens and KV move to the host prompt store (prompt_store.py) first, if the
engine has one. A running request's committed prompt entries serve too (``share``): requests that
arrive together with one system prompt prefill it once, and the others copy it.

Bookkeeping is one token list per slot, recorded when the slot is released. Whoever else allocates
a slot of the same KV cache and writes into it (the engine's cost calibration) must ``invalidate`` it.
"""
from __future__ import annotations

import itertools

from ..runtime.kv_cache import KVCache
from ..speculative.proposer import Proposer, Stash
from .prompt_store import PromptStore, common_prefix_len

__all__ = ["PrefixCache", "common_prefix_len"]


class PrefixCache:
    def __init__(self, kv: KVCache, store: PromptStore | None = None):
        """store: where a free slot's cached tokens go before the slot is overwritten (None: lost)."""
        self.kv, self.store = kv, store
        self.cached: dict[int, list[int]] = {}  # slot -> tokens whose KV the (free) slot holds
        self._released_at: dict[int, int] = {}  # slot -> release order, for least-recently-used eviction
        self._clock = itertools.count()
        self.queries = 0  # admissions that looked up the cache
        self.hits = 0  # admissions that reused at least one token
        self.prompt_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # prompt tokens whose prefill was skipped (from a slot or the store)

    def allocate(self, prompt_ids: list[int], proposer: Proposer | None = None) -> tuple[int, int, int, Stash | None]:
        """Takes a free slot for the prompt and returns (slot, reused, kept, stash): the slot's committed
        length is set to ``reused``, the prompt tokens whose KV it now holds; ``kept`` of them it held
        from its previous request (what a drafter's state kept with the slot may resume; 0 when they
        came from the store, with the drafter's ``stash`` of its state for them, if any). The slot is
        the free one sharing the longest prefix with the prompt (ties and misses: the least recently
        used), unless the store holds a longer one: then the least useful free slot takes the store's
        entries. At least the last prompt token is left out, as it is the first draft root. A slot's
        tokens that go to the store take ``proposer``'s stash of the state it kept for them."""
        free = self.kv.free_slot_ids()[::-1]  # in the order plain allocation hands them out (ties go first)
        if not free:
            return self.kv.allocate(), 0, 0, None  # raises the KV cache's own "no free slot" error
        limit = len(prompt_ids) - 1
        matches = {s: min(common_prefix_len(self.cached.get(s, []), prompt_ids), limit) for s in free}
        slot = max(free, key=lambda s: (matches[s], -self._released_at.get(s, -1)))
        entry, from_store = self.store.match(prompt_ids) if self.store is not None else (-1, 0)
        stash = None
        if min(from_store, limit) > matches[slot]:
            slot = min(free, key=lambda s: (matches[s], self._released_at.get(s, -1)))
            self._spill(slot, 0, proposer)
            self.kv.allocate(slot)
            reused, kept = min(from_store, limit), 0
            k, v, stash = self.store.take(entry, reused)
            self.kv.load(slot, k, v)
        else:
            reused = kept = matches[slot]
            self._spill(slot, reused, proposer)
            self.kv.allocate(slot)
        self.cached.pop(slot, None)
        self.kv.set_length(slot, reused)
        self.queries += 1
        self.hits += reused > 0
        self.prompt_tokens += len(prompt_ids)
        self.hit_tokens += reused
        return slot, reused, kept, stash

    def share(self, seq, running, proposer) -> int:
        """``seq`` took its slot cold (nothing of its prompt there) and is not prefilled yet: copies into
        it the longest prefix (at most all but the last prompt token, the first root) whose KV a request
        in ``running`` has committed, as far as the drafter lets it (``Proposer.share`` takes what its
        state for that request holds and says from where it still needs the prompt). Returns the
        tokens copied (0: none), counted as a hit; sets the slot's length to them."""
        limit, donor, n = len(seq.prompt_ids) - 1, None, 0
        for d in running:
            have = self.kv.lengths[d.slot] if d is not seq and d.slot >= 0 else 0
            m = min(common_prefix_len(d.prompt_ids, seq.prompt_ids), have, limit) if have else 0
            if m > n:
                donor, n = d, m
        n = proposer.share(seq, donor, n) if n else 0
        if n > 0:
            self.kv.copy_prefix(donor.slot, seq.slot, n)
            self.kv.set_length(seq.slot, n)
            self.hits += 1
            self.hit_tokens += n
        return n

    def _spill(self, slot: int, keep: int, proposer: Proposer | None) -> None:
        """The free slot's entries past ``keep`` are about to be overwritten: its cached tokens go to
        the store whole, if there is one, with the drafter's stash of the state it kept for them. Tokens
        an entry already holds whole are not copied at all."""
        tokens = self.cached.get(slot)
        if self.store is not None and tokens and len(tokens) > keep and not self.store.holds(tokens):
            stash = proposer.stash(slot) if proposer is not None else None
            self.store.add(tokens, *self.kv.read(slot, len(tokens)), stash)

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
        if self.store is not None:
            self.store.clear()
