"""--spec-type ngram-mod: llama.cpp's hashed n-gram pool, shared by every request of the engine.

A fixed table of TABLE_SIZE int32 entries maps the hash of n_match consecutive tokens to the token
that last followed them (last write wins, no collision check: a collision at worst proposes a
wrong token, which verification rejects). Every request's prompt and output are added, so what one
request wrote helps the next (an agent editing one file, the same function asked again). A draft
chains lookups: the last n_match tokens give the next token, which joins the window for the next
lookup, until a miss or the cap; a chain shorter than n_min is dropped. Deterministic drafts.

The hash is llama.cpp's: h = sum_i t_i * M^(n-1-i) mod 2^64 (folding h = h * M + t), so a window
slides in O(1): h' = (h - t_out * M^(n-1)) * M + t_in. Two resets bound the damage of a table that
went stale: after adding a prompt, more than 25 % occupancy wipes it; five drafts in a row of one
request with under 25 % acceptance wipe it too."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..config import SpecConfig
from .controller import ema
from .proposer import Proposer
from .tree import DraftTree

TABLE_SIZE = 4 * 1024 * 1024  # entries (16 MiB), as llama.cpp
MULT = 6364136223846793005
MASK = (1 << 64) - 1
EMPTY = -1
OCCUPANCY_RESET = 0.25
LOW_ACCEPT, LOW_STREAK = 0.25, 5
ADD_EVERY = 32  # output tokens are added in chunks, as llama.cpp does


@dataclass
class _State:
    added: int = 0  # tokens of seq.tokens whose windows (ending before them) are in the table
    drafted: int = 0  # length of the last draft
    low: int = 0  # consecutive low-acceptance drafts


class NgramModProposer(Proposer):
    name = "ngram-mod"
    draftless = True

    def __init__(self, spec: SpecConfig):
        self.n, self.n_min, self.n_max = spec.ngram_mod_n_match, spec.ngram_mod_n_min, spec.ngram_mod_n_max
        self.table = np.full(TABLE_SIZE, EMPTY, dtype=np.int32)
        self.used = 0
        self._top = pow(MULT, self.n - 1, 1 << 64)  # M^(n-1): the weight of a window's oldest token
        self._cost = 0.0

    @property
    def max_tokens(self) -> int:
        return self.n_max

    def reset(self) -> None:
        self.table.fill(EMPTY)
        self.used = 0

    def _hash(self, window) -> int:
        h = 0
        for t in window:
            h = (h * MULT + t) & MASK
        return h

    def _add(self, tokens: list[int], start: int, end: int) -> None:
        """Adds the windows tokens[i - n:i] -> tokens[i] for i in [max(start, n), end)."""
        start = max(start, self.n)
        if start >= end:
            return
        h = self._hash(tokens[start - self.n:start])
        table = self.table
        for i in range(start, end):
            idx = h % TABLE_SIZE
            self.used += int(table[idx] == EMPTY)
            table[idx] = tokens[i]
            h = (((h - tokens[i - self.n] * self._top) * MULT) + tokens[i]) & MASK  # window now ends at i

    def prefill(self, seq, start, end, hidden=None):
        st = seq.draft_state = seq.draft_state or _State()
        if end == len(seq.prompt_ids) - 1:  # the whole prompt (as llama.cpp's begin: one pass, then the check)
            self._catch_up(seq, st, len(seq.prompt_ids))
            if self.used > OCCUPANCY_RESET * TABLE_SIZE:
                self.reset()

    def _catch_up(self, seq, st: _State, upto: int) -> None:
        tokens = seq.tokens
        self._add(tokens, st.added, upto)
        st.added = max(st.added, upto)

    def propose(self, seqs, max_tokens):
        t0 = time.perf_counter()
        trees = []
        for seq, k in zip(seqs, max_tokens):
            st = seq.draft_state = seq.draft_state or _State()
            tokens = seq.tokens
            if len(tokens) - st.added >= ADD_EVERY or st.added < len(seq.prompt_ids):
                self._catch_up(seq, st, len(tokens))
            draft = []
            if k > 0 and len(tokens) >= self.n:
                window = tokens[-self.n:]
                h = self._hash(window)
                for _ in range(k):
                    tok = int(self.table[h % TABLE_SIZE])
                    if tok == EMPTY:
                        break
                    draft.append(tok)
                    h = (((h - window[len(draft) - 1] * self._top) * MULT) + tok) & MASK
                    window.append(tok)
                if len(draft) < min(self.n_min, k):
                    draft = []
            st.drafted = len(draft)
            trees.append(DraftTree.chain(draft))
        self._cost = ema(self._cost, (time.perf_counter() - t0) / max(1, sum(max_tokens)))
        return trees

    def commit(self, seq, num_accepted, hidden=None):
        st = seq.draft_state
        if st is None or not st.drafted:
            return
        if num_accepted / st.drafted < LOW_ACCEPT:
            st.low += 1
            if st.low >= LOW_STREAK:  # the table has drifted into confidently wrong drafts
                self.reset()
                st.low, st.added = 0, 0
        else:
            st.low = 0
        st.drafted = 0

    def discard(self, seq):
        if seq.draft_state is not None:
            seq.draft_state.drafted = 0

    def release(self, seq):
        st = seq.draft_state
        if st is not None:  # the finished request's output joins the pool for later requests
            self._catch_up(seq, st, len(seq.tokens))
        seq.draft_state = None

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost * n_seqs
