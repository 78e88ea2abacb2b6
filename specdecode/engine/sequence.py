"""One generation request as the engine tracks it.

Invariant: the target's KV cache (slot ``slot``) holds ``tokens[:-1]``; the last token (the root of
the next draft) is fed in the next verify forward."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..sampling import RandomStream, TokenLogprob
from ..sampling_params import SamplingParams
from ..speculative.controller import AcceptanceEstimate
from ..speculative.metrics import SpecStats
from ..tokenizer.detok import StreamingDetokenizer
from .stop import StopChecker

_ids = itertools.count()


@dataclass
class Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    detok: StreamingDetokenizer
    eos_ids: frozenset[int]
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    random: RandomStream | None = None  # sampled requests: the per-position random numbers
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    text: str = ""  # visible completion text (stop strings cut off)
    stats: SpecStats = field(default_factory=SpecStats)
    acceptance: AcceptanceEstimate = field(default_factory=AcceptanceEstimate)  # the controller's record
    draft_state: object = None  # the proposer's own per-request state (its type is the proposer's)
    num_prefilled: int = 0  # prompt tokens already in the KV cache (chunked prefill)
    # of those, the slot's previous request's at admission (a drafter's state kept with the slot resumes
    # them; tokens the prompt store supplied are not among them)
    num_cached: int = 0
    max_len: int = 1 << 62  # context length: the sequence stops ("length") when it reaches it
    t_arrival: float = field(default_factory=time.perf_counter)
    t_first_token: float | None = None
    t_prefill_done: float | None = None
    t_finished: float | None = None
    # one TokenLogprob per output token (output_ids' order) when params.logprobs is set, else None
    logprobs: list[TokenLogprob] | None = None

    def __post_init__(self):
        self.stop = StopChecker(tuple(self.params.stop))  # holds back a possible stop string's start
        # prompt_ids + output_ids, kept in step by append (drafters read it every step: a property that
        # concatenated would copy the whole context each time)
        self._tokens = self.prompt_ids + self.output_ids
        if self.params.logprobs is not None:
            self.logprobs = []

    @property
    def tokens(self) -> list[int]:
        """prompt_ids + output_ids (the sequence's own list: read it, never change it)."""
        return self._tokens

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, new_tokens: list[int], logprobs: list[TokenLogprob] | None = None) -> str:
        """Appends generated tokens (with their log probabilities, one per token, when requested),
        applying EOS / stop tokens / max_tokens / stop strings. Returns the newly visible text. Tokens
        after a stop condition are dropped, and so are their log probabilities."""
        if self.t_first_token is None:
            self.t_first_token = time.perf_counter()
        p = self.params
        delta = ""
        for i, t in enumerate(new_tokens):
            if self.finished:
                break
            self.output_ids.append(t)
            self._tokens.append(t)
            if self.logprobs is not None:
                self.logprobs.append(logprobs[i])
            piece = ""
            if (t in self.eos_ids and not p.ignore_eos) or t in p.stop_token_ids:
                self.finish_reason = "stop"
            else:
                piece = self.detok.add(t)
            if not self.finished and (len(self.output_ids) >= p.max_tokens or self.num_tokens >= self.max_len):
                self.finish_reason = "length"
            if self.finished:
                piece += self.detok.flush()
            delta += self.stop.feed(piece)  # only the new text is scanned
            if self.stop.matched is not None:
                self.finish_reason = "stop"
            elif self.finished:
                delta += self.stop.flush()
        if self.finished:
            self.t_finished = time.perf_counter()
        self.text += delta
        return delta

    def abort(self) -> None:
        if not self.finished:
            self.finish_reason = "abort"
            self.t_finished = time.perf_counter()

    def fail(self) -> None:
        """A step failed for this request: it ends (the engine frees it and forgets its KV)."""
        if not self.finished:
            self.finish_reason = "error"
            self.t_finished = time.perf_counter()
