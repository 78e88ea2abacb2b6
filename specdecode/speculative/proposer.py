"""The one interface every drafter implements (none, draft model, n-gram, EAGLE, MTP), and what it sees."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..sampling import DRAFT, RandomStream, draft_token
from ..sampling_params import SamplingParams
from .controller import AcceptanceEstimate
from .tree import DraftTree


class SeqView(Protocol):
    """What a proposer reads of a request (the engine's Sequence satisfies it). The target's KV slot
    ``slot`` holds ``tokens[:-1]``; the last token is the root of the next draft. ``draft_state`` is
    the proposer's own per-request state (None until it sets it); ``random`` the request's random
    numbers by position (None for greedy requests). ``num_cached``: the leading prompt tokens the
    slot already held at admission (a prefix-cache hit), which the same tokens of the slot's previous
    request put there (speculative/kept.py)."""

    prompt_ids: list[int]
    params: SamplingParams
    acceptance: AcceptanceEstimate
    slot: int
    num_cached: int
    random: RandomStream | None
    draft_state: Any

    @property
    def tokens(self) -> list[int]: ...


# (final normed states [r, H], {layer: output [r, H]} for capture_layers) of r target positions.
Hidden = tuple[torch.Tensor, dict[int, torch.Tensor]]


@dataclass(frozen=True)
class Stash:
    """A drafter's state for one finished request, copied to host memory (``Proposer.stash``): what the
    prompt store holds beside that request's KV, its ``nbytes`` counted in the store's budget."""

    state: Any
    nbytes: int


class Proposer:
    """Contract:
    - ``propose(seqs, max_tokens)`` returns one DraftTree per sequence with at most ``max_tokens[b]``
      nodes (fewer, or none, is always allowed; a chain that merged two members' drafts in ``plan``
      may return up to the ``rooms[b]`` plan was given). Tokens are drafted after ``seq.tokens``
      (whose last token, the root, is not yet in the target's KV cache). Sampled drafts carry the
      exact processed distribution each token was drawn from (``draft_probs``); deterministic drafts
      carry None.
    - ``commit(seq, num_accepted, hidden)`` is called after the sequence's tokens were extended by the
      accepted draft tokens plus one target token; the proposer rolls its own state (e.g. KV cache)
      back to what is still valid. In a chain's merged step the accepted tokens may be another
      member's: a proposer keeps only what its own drafts match of seq.tokens. ``hidden`` (only for
      ``reads_hidden`` proposers, else None): the target's states of the rows the verify committed,
      the root and the accepted path, i.e. positions len(seq.tokens) - num_accepted - 2 ..
      len(seq.tokens) - 2.
    - ``prefill(seq, start, end, hidden)`` is called after each chunk of the target's prefill (prompt
      positions start .. end - 1, ``hidden`` as in commit, for those positions): a drafter with its
      own cache ingests the prompt then (time to first token), or keeps what it needs and owes the
      work to its first draft (an EAGLE head: a request it never drafts for never pays for it);
      owed prompt work is not a catch-up (below), as a drafter that ingested at prefill paid it anyway.
    - ``prefill_start(seq, cached)``: a request was admitted with its first ``cached`` prompt positions
      already in the target's cache (a prefix-cache hit); the first position whose hidden states the
      proposer still needs (<= cached). The engine prefills again from there, so those states come
      from the prefill's own forward (with the rest of the prompt) instead of a one-off target
      forward of the drafter's; the positions it recomputes get the keys and values they hold. A
      drafter may instead return ``cached`` and owe such states to its first draft, recomputing them
      then (an EAGLE head after a host-store hit: a request it never drafts for never pays).
    - ``share(seq, donor, n)``: a request admitted cold, before any prefill, takes the target's KV
      of its first ``n`` prompt positions from ``donor``, a running request with the same ones; as
      ``prefill_start``, the first position whose states the drafter still needs (<= n). A drafter
      may copy what its state for ``donor`` holds of those positions (the default copies nothing).
    - ``release(seq)`` frees per-sequence state when the sequence finishes (a drafter with its own
      cache may keep it for the slot's next request instead: speculative/kept.py).
    - ``stash(slot)``: the engine's prompt store is about to take the tokens and KV that target slot
      ``slot`` kept from its last request (its slot serves another prompt now); a ``Stash``, a host
      copy of the state the drafter kept for that request, travels with them, or None (the default:
      nothing kept; the drafter then starts a later store hit as ``prefill_start`` says). ``unstash(seq,
      stash)``: ``seq`` was admitted with its first ``seq.num_prefilled`` prompt positions taken from
      that store entry; its state starts from the copy, cut back to those positions as a kept state is
      after a slot's prefix hit. Called before ``prefill_start``, which then sees that state.
    - ``draft_cost(n_seqs)``: measured seconds per drafting unit for a batch of n_seqs (0 for free
      drafters); the draft-length controller weighs it against the target's verify cost.
      ``catch_up_cost(seqs)``: seconds a draft for these sequences would spend once before drafting,
      bringing the drafter up to date with what it skipped (a head's entries left unfed while it did
      not draft); the controller adds it to the step's cost, so a drafter idle for long is chosen
      again only where its expected gain covers that.
    - ``depth(k)``: the positions a draft of k tokens reaches and the drafting units it costs (k for a
      chain; a tree's k nodes reach at most its depth): the controller counts gains and drafting
      costs over depth(k) positions, and verify costs over k + 1 rows.
    - ``reads_hidden``: the proposer reads the target's hidden states (EAGLE, MTP), and
      ``capture_layers`` names the decoder layers whose outputs it needs besides the final states.
    - ``draftless``: it drafts from token statistics alone, in microseconds (n-gram kinds, suffix):
      a chain of proposers runs it first (speculative/chain.py). ``discard(seq)``: the draft it just
      proposed for seq will not be verified (a chain chose another member). ``prior_acceptance`` (a
      model drafter) and ``evidence_prior(c)`` (a draftless one, per evidence class): measured
      acceptance the controller starts from.
    - The controller's hooks, whose defaults suit a single proposer: ``plan(seqs, rooms, value,
      fixed, verify)`` before the draft length is chosen (a chain picks members there);
      ``estimate(seq, k)`` the per-position acceptance estimates of a k-token draft;
      ``observe(seq, k, drafted, accepted)`` after verification; ``drafted_by(seq)`` the name the step's statistics record.
    A proposer gets the target through a ``runtime.target.Target`` handle, never the engine."""

    name = "none"
    reads_hidden = False
    capture_layers: tuple[int, ...] = ()
    # True: a draft of k tokens is a chain of depth k, so a shorter one (no n-gram match, a draft
    # below --draft-p-min) leaves positions it was asked for undrafted; the controller counts them
    # as misses (they gained nothing, and in a batch they still cost their padded rows).
    chain_drafts = True
    draftless = False
    # A model drafter's measured acceptance per draft position, where it ships one (a trained head's
    # held-out report): the prior of its engine-wide record instead of the optimistic PRIOR_ALPHA.
    prior_acceptance: tuple[float, ...] = ()

    def evidence_prior(self, evidence: int) -> tuple[float, ...]:
        """A draftless drafter's measured acceptance per draft position for drafts of one evidence class
        (``DraftTree.evidence``), where it ships one: the prior of that class's engine-wide record in a
        chain, instead of the optimistic PRIOR_ALPHA. () for none."""
        return ()

    def propose(self, seqs: list[SeqView], max_tokens: list[int]) -> list[DraftTree]:
        return [DraftTree.empty() for _ in seqs]

    def commit(self, seq: SeqView, num_accepted: int, hidden: Hidden | None) -> None:
        pass

    def prefill(self, seq: SeqView, start: int, end: int, hidden: Hidden) -> None:
        pass

    def prefill_start(self, seq: SeqView, cached: int) -> int:
        return cached

    def share(self, seq: SeqView, donor: SeqView, n: int) -> int:
        return self.prefill_start(seq, n)

    def release(self, seq: SeqView) -> None:
        pass

    def stash(self, slot: int) -> Stash | None:
        return None

    def unstash(self, seq: SeqView, stash: Stash) -> None:
        pass

    def draft_cost(self, n_seqs: int = 1) -> float:
        return 0.0

    def catch_up_cost(self, seqs: list[SeqView]) -> float:
        return 0.0

    def depth(self, k: int) -> int:
        """Positions a draft of k tokens can reach (a chain: k) and the drafting units it costs."""
        return k

    @property
    def max_tokens(self) -> int:
        """Upper bound on nodes per draft (the controller never asks for more)."""
        return 1 << 30

    def discard(self, seq: SeqView) -> None:
        pass

    # -- the controller's hooks ---------------------------------------------------------------------
    def plan(self, seqs: list[SeqView], rooms: list[int], value, fixed: bool = False, verify=None) -> None:
        pass

    def estimate(self, seq: SeqView, k: int) -> list[float]:
        return seq.acceptance.alphas(k)

    def observe(self, seq: SeqView, k: int, drafted: int, accepted: int) -> None:
        """k: the draft cap the controller set; drafted: the depth verified. A chain drafter asked for
        k tokens that drafted fewer (no match, an unconfident token) missed the rest: in a batch they
        still cost their padded rows."""
        seq.acceptance.observe(max(k, drafted) if self.chain_drafts else drafted, accepted)

    def drafted_by(self, seq: SeqView) -> str:
        return self.name


def extend_chain(tokens: list[int], qs: list, logits, seq: SeqView, p_min: float, max_tokens: int,
                 ids: torch.Tensor | None = None, vocab_size: int = 0) -> bool:
    """One step of a model drafter's chain: draws a token from ``logits`` [V] (``sampling.draft_token``;
    ids, vocab_size: its sub-vocabulary) and appends it, with the q it was drawn from (sampled requests),
    to ``tokens`` / ``qs``, unless the chain already has a token and this one is not confident
    (``--draft-p-min``). Returns whether the chain goes on (a token was appended and there is room for
    another)."""
    # a drafted token's number is keyed by the position it would take, so it never shifts the target's
    u = None if seq.random is None else seq.random.u([len(seq.tokens) + len(tokens)], DRAFT)
    tok, q, confident = draft_token(logits, seq.params, u, p_min, ids, vocab_size)
    if not confident and tokens:
        return False  # stop this chain before a likely-wrong token
    tokens.append(tok)
    if q is not None:
        qs.append(q)
    return len(tokens) < max_tokens
