"""Prompt KV kept in host memory after its slot is reused (llama.cpp's ``--cache-ram``).

The slot prefix cache (prefix_cache.py) keeps a finished request's KV only as long as its slot stays
free: with more conversations than slots, the next turn of a chat usually finds its slot taken by
someone else and prefills the whole conversation again. Before a slot's cached tokens are
overwritten, the prefix cache hands them here; a later prompt that starts with more of an entry's
tokens than any free slot holds gets that entry's KV copied into its slot instead of a prefill.
Positions match (an entry always starts at position 0), so the copied entries are the bits a
prefill would compute and greedy output does not change.

Entries are (tokens, k, v, stash) with k, v [layers, Hkv, n, D] in host memory and the drafter's copy of
its state for the request that left them (``Proposer.stash``; None if it kept none), least recently used
first out once their bytes (the stash's counted) pass the budget. An entry whose tokens start another
entry's is redundant and is not kept."""
from __future__ import annotations

from collections import OrderedDict

import torch

from ..speculative.proposer import Stash


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptStore:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.bytes = 0
        self._entries: OrderedDict[int, tuple[list[int], torch.Tensor, torch.Tensor, Stash | None]] = OrderedDict()
        self._next = 0  # entry ids, in insertion order
        self.hits = 0  # admissions served from here
        self.hit_tokens = 0  # prompt tokens they did not prefill

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, tokens: list[int], k: torch.Tensor, v: torch.Tensor, stash: Stash | None = None) -> None:
        """Keeps the KV of ``tokens`` (k, v [layers, Hkv, len(tokens), D], host copies the store owns) and
        the drafter's ``stash`` of its state for them."""
        size = _size(k, v, stash)
        if not tokens or size > self.budget or self.holds(tokens):
            return
        for key, (toks, *_) in list(self._entries.items()):
            if common_prefix_len(toks, tokens) == len(toks):  # the new entry holds this one whole
                self._drop(key)
        self._entries[self._next] = (list(tokens), k, v, stash)
        self._next += 1
        self.bytes += size
        while self.bytes > self.budget:
            self._drop(next(iter(self._entries)))

    def holds(self, tokens: list[int]) -> bool:
        """Whether an entry already holds all of ``tokens`` (their KV would add nothing): that entry
        then counts as just used."""
        for key, (toks, *_) in self._entries.items():
            if len(toks) >= len(tokens) and common_prefix_len(toks, tokens) == len(tokens):
                self._entries.move_to_end(key)
                return True
        return False

    def match(self, prompt_ids: list[int]) -> tuple[int, int]:
        """(entry id, tokens its KV shares with the prompt) of the longest match; (-1, 0) if none."""
        best, n = -1, 0
        for key, (toks, *_) in self._entries.items():
            if toks[0] != prompt_ids[0]:
                continue
            m = common_prefix_len(toks, prompt_ids)
            if m > n:
                best, n = key, m
        return best, n

    def take(self, key: int, n: int) -> tuple[torch.Tensor, torch.Tensor, Stash | None]:
        """Entry ``key``'s first n positions (k, v views) and its stash (the drafter cuts it back to n
        positions; it must not change it), counted as a hit; the entry stays, most recent."""
        _, k, v, stash = self._entries[key]
        self._entries.move_to_end(key)
        self.hits += 1
        self.hit_tokens += n
        return k[:, :, :n], v[:, :, :n], stash

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _drop(self, key: int) -> None:
        _, k, v, stash = self._entries.pop(key)
        self.bytes -= _size(k, v, stash)


def _size(k: torch.Tensor, v: torch.Tensor, stash: Stash | None) -> int:
    return k.nbytes + v.nbytes + (stash.nbytes if stash else 0)
