"""Draft state kept across requests, so that a prefix-cache hit skips the drafter's prompt work too.

A drafter with a cache of its own (a draft model's KV cache, an EAGLE or MTP head's) fills it for a
prompt as the target fills its own. When a request finishes, its state is kept under the target slot
it leaves instead of being freed. The engine's prefix cache may hand that slot to a new request that
shares the first ``seq.num_cached`` tokens with the old one; the drafter then resumes the old state,
cut back to the entries those tokens alone determine, instead of recomputing the whole prompt (for a
head: a forward of the target over up to 256 prompt positions, seconds on a CPU).

Invariant: ``kept[s]`` is the state of the last request released from target slot s (every release
replaces it, with None when that request never made a state), and that is the request whose tokens
the prefix cache matched for slot s. Kept states hold drafter cache slots; a drafter's cache has one
slot per target slot plus a scratch slot, and each target slot holds at most one state (its running
request's or its kept one), so neither ever runs out. When the prefix cache moves a slot's tokens to the
host prompt store, the drafter may copy the state kept under it there too (``Proposer.stash``)."""
from __future__ import annotations

from typing import Any, Callable


class KeptStates:
    def __init__(self, free: Callable[[Any], None]):
        self._kept: dict[int, Any] = {}  # target slot -> draft state of the request that last left it
        self._free = free  # releases a state's drafter cache slot

    def keep(self, seq, state) -> None:
        """``seq`` (still holding its target slot) is finishing; ``state`` is its draft state or None."""
        old = self._kept.pop(seq.slot, None)
        if old is not None:
            self._free(old)
        if state is not None:
            self._kept[seq.slot] = state

    def peek(self, slot: int) -> Any | None:
        """The state kept under target slot ``slot`` (left in place), or None."""
        return self._kept.get(slot)

    def take(self, seq) -> Any | None:
        """The state kept under ``seq``'s target slot when ``seq`` reuses some of its tokens (the caller
        cuts it back to ``seq.num_cached`` tokens); otherwise None, the kept state being freed."""
        old = self._kept.pop(seq.slot, None)
        if old is not None and seq.num_cached <= 0:
            self._free(old)
            return None
        return old
