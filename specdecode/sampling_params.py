"""Per-request sampling settings, defined once here for the engine, the CLI and the server.

Defaults follow vLLM (and the OpenAI API): temperature 1.0, no top-k / top-p / min-p filtering.
Invalid values raise ``InvalidRequestError`` with a one-line message the CLI and server show as is."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import InvalidRequestError

# Temperatures below this are treated as greedy, like vLLM's _SAMPLING_EPS: dividing logits by a
# tiny temperature overflows float32, and the resulting distribution would be one-hot anyway.
GREEDY_TEMPERATURE = 1e-5
# Integer settings are bounded where they are validated, so that no value a client can send
# overflows a tensor inside the shared engine step (a top-k past the vocabulary disables nothing).
MAX_INT32 = (1 << 31) - 1
# Most alternatives a token's log probabilities may list (OpenAI's top_logprobs allows 20).
MAX_LOGPROBS = 20
MAX_REPETITION_PENALTY = 10.0  # far past any useful value (vLLM's examples use 1.0-2.0)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled (-1 is what vLLM / OpenAI-style clients send; stored as 0)
    min_p: float = 0.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()  # output is cut before the first stop string, which is not returned
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # OpenAI's penalties on the output so far (logit -= presence * [count > 0] + frequency * count) and
    # the repetition penalty over prompt and output (a seen token's logit / r if positive, * r if not),
    # as vLLM applies them: before temperature and filters, greedy requests included
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # None: no log probabilities; k >= 0: each output token's log probability under the model, with the
    # k most likely tokens at its position (the raw distribution, before temperature and filters)
    logprobs: int | None = None

    def __post_init__(self):
        # Lists and a bare string are accepted for convenience; stored as tuples so the object
        # stays hashable and immutable.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        _check(_is_real(self.temperature) and self.temperature >= 0,
               f"temperature must be >= 0, got {self.temperature!r}")
        _check(_is_real(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(_is_int(self.top_k) and -1 <= self.top_k <= MAX_INT32,
               f"top_k must be an integer in [-1, {MAX_INT32}] (0 or -1 disables it), got {self.top_k!r}")
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        _check(_is_real(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p!r}")
        _check(_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_INT32,
               f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        _check(self.seed is None or (_is_int(self.seed) and -(1 << 63) <= self.seed < (1 << 64)),
               f"seed must be a 64-bit integer, got {self.seed!r}")
        _check(all(isinstance(s, str) and s for s in stop), "stop must be a list of non-empty strings")
        _check(all(_is_int(t) and 0 <= t <= MAX_INT32 for t in self.stop_token_ids),
               "stop_token_ids must be a list of non-negative integers")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_real(value) and -2 <= value <= 2, f"{name} must be in [-2, 2], got {value!r}")
        _check(_is_real(self.repetition_penalty) and 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY,
               f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty!r}")
        _check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
               f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def penalized(self) -> bool:
        """The distribution depends on the tokens so far (a penalty is set)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message)
