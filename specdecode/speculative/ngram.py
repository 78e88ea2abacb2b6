"""N-gram drafting from the sequence itself (prompt lookup): no model, no memory worth mentioning.

``ngram-simple`` (llama.cpp): match exactly the last n tokens. ``ngram`` (prompt lookup, as in
transformers / vLLM): try n from prompt_lookup_max down to prompt_lookup_min, first match wins. Both
propose the tokens that followed the most recent earlier occurrence. Drafts are deterministic."""
from __future__ import annotations

import time

from ..config import SpecConfig
from .controller import ema
from .proposer import Proposer
from .tree import DraftTree


def find_continuation(tokens: list[int], n: int, k: int) -> list[int]:
    """Up to k tokens following the most recent earlier occurrence of tokens[-n:] (or [] if none)."""
    if k <= 0 or len(tokens) <= n:
        return []
    pattern = tokens[-n:]
    first = pattern[0]
    # scan start positions from the most recent backwards; the suffix itself (start len-n) is excluded
    for start in range(len(tokens) - n - 1, -1, -1):
        if tokens[start] == first and tokens[start:start + n] == pattern:
            return tokens[start + n:start + n + k]
    return []


class NgramProposer(Proposer):
    draftless = True

    def __init__(self, spec: SpecConfig):
        self.name = spec.spec_type
        self.sizes = ([spec.ngram_size_n] if spec.spec_type == "ngram-simple"
                      else list(range(spec.prompt_lookup_max, spec.prompt_lookup_min - 1, -1)))
        self._cost = 0.0  # measured seconds per proposal (EMA); tiny, but measured, not assumed
        self._max = spec.ngram_size_m

    @property
    def max_tokens(self) -> int:
        return self._max

    def propose(self, seqs, max_tokens):
        t0 = time.perf_counter()
        trees = []
        for seq, k in zip(seqs, max_tokens):
            toks = seq.tokens
            draft = []
            for n in self.sizes:
                draft = find_continuation(toks, n, k)
                if draft:
                    break
            trees.append(DraftTree.chain(draft))
        spent = (time.perf_counter() - t0) / max(1, sum(max_tokens))
        self._cost = ema(self._cost, spent)
        return trees

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost * n_seqs
