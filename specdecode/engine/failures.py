"""What a step hands back per sequence, and how a step that raises ends only the requests it must.

A request whose data makes a forward raise (a token id past the vocabulary, a NaN from a bad adapter)
must not take the batch down with it: the others keep every token they had and advance as a plain
step would have advanced them."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from .sequence import Sequence
from .spec_step import speculative_step

log = logging.getLogger("specdecode")


@dataclass
class StepOutput:
    seq: Sequence
    delta: str
    error: Exception | None = None  # the step failed for this sequence alone, and ended it


def fail(seq: Sequence, error: Exception) -> StepOutput:
    """Ends ``seq`` with finish reason "error"; the detail goes to the log, what a client sees is the
    caller's choice."""
    log.error("request %d failed and was ended: %r", seq.seq_id, error, exc_info=error)
    seq.fail()
    return StepOutput(seq, "", error)


def snapshot(seqs: list[Sequence], kv) -> list[tuple[int, int, int, int]]:
    """Before a batched step: each sequence's (steps, tokens, KV length, text shown), what ``isolate``
    compares with to tell how far the step got for it."""
    return [(s.stats.steps, s.num_tokens, kv.lengths[s.slot], len(s.text)) for s in seqs]


def isolate(runner, proposer, seqs: list[Sequence], before: list[tuple], error: Exception,
            now) -> list[StepOutput]:
    """A batched step raised. Sequences it committed keep their tokens; one it left half-committed
    fails; the rest are stepped one at a time without a draft (for the proposer: a step whose draft
    was rejected), so a request whose data makes the step raise fails alone and the others advance
    by exactly the token a plain step gives them (nothing is committed twice)."""
    log.warning("a batched step of %d sequences failed (%r): stepping them one at a time", len(seqs), error)
    outputs = []
    for seq, (steps, n, length, shown) in zip(seqs, before):
        if seq.stats.steps != steps:  # its commit completed before the failure
            outputs.append(StepOutput(seq, seq.text[shown:]))
        elif seq.num_tokens != n or runner.kv.lengths[seq.slot] != length:
            outputs.append(fail(seq, error))
        else:
            try:
                proposer.discard(seq)
                (r,), _ = speculative_step(runner, proposer, [seq], [0], now)
                outputs.append(StepOutput(seq, r.delta))
            except Exception as e:
                outputs.append(fail(seq, e))
    return outputs
