"""The one interface every drafter implements (none, draft model, n-gram, EAGLE, MTP)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..sampling import draft_token
from .tree import DraftTree

if TYPE_CHECKING:
    from ..engine.sequence import Sequence


class Proposer:
    """Contract:
    - ``propose(seqs, max_tokens)`` returns one DraftTree per sequence with at most ``max_tokens[b]``
      nodes (fewer, or none, is always allowed). Tokens are drafted after ``seq.tokens`` (whose last
      token, the root, is not yet in the target's KV cache). Sampled drafts carry the exact processed
      distribution each token was drawn from (``draft_probs``); deterministic drafts carry None.
    - ``commit(seq, num_accepted)`` is called after the sequence's tokens were extended by the accepted
      draft tokens plus one target token; the proposer rolls its own state (e.g. KV cache) back to
      what is still valid.
    - ``prefill(seq, start, end, hidden, captured)`` is called after each chunk of the target's prefill
      (prompt positions start .. end - 1; hidden [end - start, H] final normed states, captured
      {layer: [end - start, H]} for ``capture_layers``): a drafter with its own cache ingests the prompt
      then (time to first token), not inside the first draft it makes.
    - ``release(seq)`` frees per-sequence state when the sequence finishes.
    - ``draft_cost(n_seqs)``: measured seconds to draft one token for a batch of n_seqs (0 for free drafters);
      the draft-length controller weighs it against the target's verify cost.
    - ``depth(k)``: the positions a draft of k tokens reaches and the drafting units it costs (k for a
      chain; a tree's k nodes reach at most its depth): the controller counts gains and drafting
      costs over depth(k) positions, and verify costs over k + 1 rows.
    - ``reads_hidden``: the proposer reads the target's hidden states (EAGLE, MTP): after each verify
      the engine sets ``seq.hidden`` = (final normed states [kept, H], {layer: [kept, H]} for
      ``capture_layers``) of the rows it committed."""

    name = "none"
    reads_hidden = False
    capture_layers: tuple[int, ...] = ()
    # True: a draft of k tokens is a chain of depth k, so a shorter one (no n-gram match, a draft
    # below --draft-p-min) leaves positions it was asked for undrafted; the controller counts them
    # as misses (they gained nothing, and in a batch they still cost their padded rows).
    chain_drafts = True

    def propose(self, seqs: list["Sequence"], max_tokens: list[int]) -> list[DraftTree]:
        return [DraftTree.empty() for _ in seqs]

    def commit(self, seq: "Sequence", num_accepted: int) -> None:
        pass

    def prefill(self, seq: "Sequence", start: int, end: int, hidden, captured) -> None:
        pass

    def release(self, seq: "Sequence") -> None:
        pass

    def draft_cost(self, n_seqs: int = 1) -> float:
        return 0.0

    def depth(self, k: int) -> int:
        """Positions a draft of k tokens can reach (a chain: k) and the drafting units it costs."""
        return k

    @property
    def max_tokens(self) -> int:
        """Upper bound on nodes per draft (the controller never asks for more)."""
        return 1 << 30


def extend_chain(tokens: list[int], qs: list, logits, seq: "Sequence", p_min: float, max_tokens: int) -> bool:
    """One step of a model drafter's chain: draws a token from ``logits`` [V] (``sampling.draft_token``)
    and appends it, with the q it was drawn from (sampled requests), to ``tokens`` / ``qs``, unless the
    chain already has a token and this one is not confident (``--draft-p-min``). Returns whether the
    chain goes on (a token was appended and there is room for another)."""
    tok, q, confident = draft_token(logits, seq.params, seq.generator, p_min)
    if not confident and tokens:
        return False  # stop this chain before a likely-wrong token
    tokens.append(tok)
    if q is not None:
        qs.append(q)
    return len(tokens) < max_tokens
