"""The speculation gate: "never slower", checked against what plain decoding would have spent."""
from __future__ import annotations

from dataclasses import dataclass

GATE_WINDOW = 24  # steps of a batch size over which the gate compares speculation with plain decoding
GATE_PAUSE = 16  # plain steps of that batch size after a losing window; doubling per loss in a row,
GATE_BACKOFF_MAX = 2  # up to 2**2-fold (64 steps), which bounds how late a drafter that starts to pay is found
GATE_IDLE = 8  # a window whose first steps verified no draft at all is judged after this many,
GATE_IDLE_SHARE = 0.01  # and lost where its planning took more than this share of what plain steps cost


@dataclass
class _Window:
    steps: int = 0
    seconds: float = 0.0  # what speculation spent: planning, drafting and the verify forward
    planning: float = 0.0  # of which planning and drafting
    plain: float = 0.0  # what plain decoding would have spent on the same tokens
    drafted: int = 0  # draft tokens the window's steps verified
    pause: int = 0  # plain steps left before speculation is tried again
    losses: int = 0  # losing windows in a row


class SpeculationGate:
    """"Never slower", measured: per batch size, whether speculation beat plain decoding.

    The draft length follows estimates (acceptance from priors and records, costs from a model of the
    target's forwards), and estimates can be wrong in ways no single step shows: optimistic priors
    that new requests keep bringing, planning and drafting that run every step even when nothing is
    drafted. The gate checks the outcome. Over each window of GATE_WINDOW steps of one batch size B it
    adds up what the steps spent (``observe``: planning, proposing and the verify forward) and what
    plain decoding would have spent on the tokens they emitted (v(B, 1) / B per token, v from the
    cost model's measured plain steps). A window whose first GATE_IDLE steps verified no draft is judged
    then: the controller itself chose plain decoding at B each time, so those steps were plain steps
    plus their planning, and the rest of the window would only add more of it. Such a window is judged
    on its planning alone (lost where it exceeds GATE_IDLE_SHARE of the plain steps' cost): its verify
    forwards were plain ones, and comparing them with the cost model's v(B, 1) compares noise. The
    share is what planning may cost for the chance of drafting as soon as a draft appears: one
    sequence's planning is well under it (a repeat starts paying at once), a full batch's is not. A
    window that lost closes speculation at B for GATE_PAUSE steps of B (``open`` says False: those
    steps decode plainly and plan nothing), doubling with each losing window in a row up to
    2**GATE_BACKOFF_MAX; then a fresh window tries again. A window that paid resets the backoff (an idle
    one that planned cheaply leaves it). Batch sizes are judged apart: a verify row's
    price relative to one sequence's share of a step rises with the batch, so drafting that pays for
    one request may lose for eight."""

    def __init__(self):
        self._w: dict[int, _Window] = {}

    def open(self, batch: int) -> bool:
        """Whether this step of ``batch`` sequences may speculate (a closed gate counts the step)."""
        w = self._w.get(batch)
        if w is None or w.pause <= 0:
            return True
        w.pause -= 1
        return False

    def observe(self, batch: int, tokens: int, seconds: float, plain_step: float, drafted: int,
                planning: float) -> None:
        """A step that was open: ``tokens`` emitted in ``seconds``, of which ``planning`` planned and
        drafted; ``plain_step``: v(batch, 1); ``drafted``: draft tokens it verified (over the batch)."""
        w = self._w.setdefault(batch, _Window())
        w.steps += 1
        w.seconds += seconds
        w.planning += planning
        w.plain += tokens * plain_step / batch
        w.drafted += drafted
        if w.steps < GATE_WINDOW and (w.drafted or w.steps < GATE_IDLE):
            return
        if (w.plain < w.seconds) if w.drafted else (w.planning > GATE_IDLE_SHARE * w.plain):
            w.losses += 1
            w.pause = GATE_PAUSE << min(w.losses - 1, GATE_BACKOFF_MAX)
        elif w.drafted:  # paid (an idle window that planned cheaply paid nothing: the backoff stands)
            w.losses = 0
        w.steps, w.seconds, w.planning, w.plain, w.drafted = 0, 0.0, 0.0, 0.0, 0
