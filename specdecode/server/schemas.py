"""OpenAI request bodies (pydantic, strict: a string where a number belongs is a 400, not a guess)
and the response / stream-chunk objects, field for field as OpenAI sends them.

Fields beyond OpenAI's that vLLM clients send (top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids) are accepted; unknown fields are ignored, as OpenAI does. Features we do not
implement (n > 1, echo) are refused with a 400 rather than silently ignored.

Log probabilities (chat: ``logprobs`` + ``top_logprobs``; completions: ``logprobs`` = k) are the
model's raw distribution at each output token, as vLLM reports by default: the same figures with or
without speculation, since every emitted token's row is the one plain decoding computes. They cover
every generated token, the end-of-sequence token and a stop string's tokens too (as
``usage.completion_tokens`` counts them). A token's string is its text decoded alone; ``bytes`` are
that string's UTF-8 bytes (a token that ends inside a character shows U+FFFD there, as in vLLM)."""
from __future__ import annotations

import json
import time
import uuid

from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse

from ..errors import InvalidRequestError
from ..sampling import TokenLogprob
from ..sampling_params import MAX_LOGPROBS, SamplingParams


MAX_STOP, MAX_STOP_CHARS = 4, 1024  # OpenAI's 4 stop sequences; each checked after every token


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    # extra keys (name, tool_calls, reasoning_content...) go to the chat template as they came
    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[TextPart] | None = None


class BaseRequest(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    def check_supported(self) -> None:
        if self.n != 1:
            raise InvalidRequestError("only n=1 is supported")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true")
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise InvalidRequestError(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters")

    def requested_logprobs(self) -> int | None:
        """How many alternatives each token's log probabilities list (None: no log probabilities)."""
        return None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Unset fields take OpenAI's defaults (temperature 1, top_p 1); SamplingParams validates."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
            min_p=self.min_p or 0.0, max_tokens=max_tokens, seed=self.seed, stop=tuple(stop),
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            logprobs=self.requested_logprobs())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatRequest(BaseRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs needs logprobs set to true")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidRequestError(f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}]")
        if not self.messages:
            raise InvalidRequestError("messages must not be empty")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        out = []
        for m in self.messages:
            d = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):  # content parts: text only
                if any(p.type != "text" or p.text is None for p in m.content):
                    raise InvalidRequestError("only text content parts are supported")
                d["content"] = "".join(p.text for p in m.content)
            out.append(d)
        return out


class CompletionRequest(BaseRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise InvalidRequestError("echo is not supported")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise InvalidRequestError("send one prompt per request (batched prompts are not supported)")
            return p[0]
        return p


# -- responses ------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_body(message: str, type_: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ResponseBuilder:
    """The response and chunk objects of one request, for either endpoint. ``tokenizer`` decodes the
    token strings of log probabilities (read only for a request that asked for them)."""

    def __init__(self, chat: bool, model: str, tokenizer=None):
        self.chat, self.model, self.tokenizer = chat, model, tokenizer
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.text_offset = 0  # completions' text_offset: characters of the token strings rendered so far

    def logprobs(self, entries: list[TokenLogprob] | None) -> dict | None:
        """OpenAI's logprobs object for these tokens (the next ones after those rendered before):
        chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``, completions ``{tokens,
        token_logprobs, top_logprobs, text_offset}``. None where the request asked for none."""
        if entries is None:
            return None

        def piece(i: int) -> str:
            return self.tokenizer.decode([i])
        if self.chat:
            def item(i: int, lp: float) -> dict:
                s = piece(i)
                return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
            return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(i, lp) for i, lp in e.top]}
                                for e in entries]}
        tokens, offsets = [piece(e.token_id) for e in entries], []
        for s in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(s)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{piece(i): lp for i, lp in e.top} for e in entries], "text_offset": offsets}

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def full(self, text: str, finish_reason: str, use: dict, spec: dict,
             logprobs: list[TokenLogprob] | None = None) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text})
        choice.update(logprobs=self.logprobs(logprobs), finish_reason=finish_reason)
        return {**self._envelope(self.object, [choice]), "usage": use, "spec": spec}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              with_usage: bool = False, logprobs: list[TokenLogprob] | None = None) -> dict:
        """One stream chunk. With include_usage every chunk carries usage: null, as OpenAI's do.
        ``logprobs``: those of the tokens generated since the last chunk (their text may still be
        held back for a possible stop string)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text or ""}
        choice.update(logprobs=self.logprobs(logprobs), finish_reason=finish_reason)
        out = self._envelope(self.object + ".chunk" if self.chat else self.object, [choice])
        if with_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, use: dict, spec: dict) -> dict:
        obj = self.object + ".chunk" if self.chat else self.object
        return {**self._envelope(obj, []), "usage": use, "spec": spec}


def error_response(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code), status_code=status, headers=headers)


def sse(obj) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
