"""The public Python API: ``LLM`` + ``SamplingParams``.

    from specdecode import LLM, SamplingParams
    llm = LLM("qwen2.5-coder-1.5b-instruct", spec_type="draft", model_draft="qwen2.5-coder-0.5b-instruct")
    out = llm.chat([{"role": "user", "content": "Write quicksort in Python"}], SamplingParams(temperature=0))
    print(out.text, out.stats["spec"]["mean_acceptance_length"])
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator

from .config import EngineConfig, SpecConfig
from .engine.engine import Engine
from .engine.sequence import Sequence
from .sampling import TokenLogprob
from .sampling_params import SamplingParams


@dataclass
class RequestOutput:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str | None
    stats: dict
    logprobs: list[TokenLogprob] | None = None  # per token_ids entry, with SamplingParams(logprobs=k)


def _output(seq: Sequence) -> RequestOutput:
    n_out = len(seq.output_ids)
    ttft = (seq.t_first_token - seq.t_arrival) if seq.t_first_token else 0.0
    decode_s = (seq.t_finished - seq.t_first_token) if seq.t_finished and seq.t_first_token else 0.0
    stats = {
        "prompt_tokens": len(seq.prompt_ids),
        "completion_tokens": n_out,
        # prefill = time to first token (the prompt's forward plus the step that yields token 1)
        "prefill_tokens_per_s": round(len(seq.prompt_ids) / ttft, 2) if ttft > 0 else 0.0,
        "decode_tokens_per_s": round((n_out - 1) / decode_s, 2) if decode_s > 0 and n_out > 1 else 0.0,
        "time_to_first_token_s": round(ttft, 4),
        "spec": seq.stats.to_dict(),
    }
    return RequestOutput(seq.text, list(seq.output_ids), list(seq.prompt_ids), seq.finish_reason, stats,
                         None if seq.logprobs is None else list(seq.logprobs))


class LLM:
    def __init__(self, model: str | None = None, *, engine_config: EngineConfig | None = None,
                 _model=None, _tokenizer=None, _draft=None, **options):
        """``options`` are EngineConfig and SpecConfig fields by name (spec_type, model_draft, draft_max,
        dtype, max_model_len, ...)."""
        if engine_config is None:
            spec_keys = {f.name for f in fields(SpecConfig)}
            spec = SpecConfig(**{k: v for k, v in options.items() if k in spec_keys})
            eng = {k: v for k, v in options.items() if k not in spec_keys}
            if model is not None:
                eng["model"] = model
            engine_config = EngineConfig(spec=spec, **eng)
        self.engine = Engine(engine_config, _model, _tokenizer, _draft)
        self.tokenizer = self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prompt's KV (slots and host store); False if prefix caching is off."""
        return self.engine.reset_prefix_cache()

    def encode_chat(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(prompt)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Yields visible text as it is generated; ``self.last_output`` holds the result afterwards."""
        seq = self.engine.add_request(self.encode(prompt), params or SamplingParams())
        try:
            while not seq.finished:
                for out in self.engine.step():
                    if out.seq is seq and out.error is not None:
                        raise out.error
                    if out.seq is seq and out.delta:
                        yield out.delta
        finally:
            if not seq.finished:
                self.engine.abort(seq)
            self.last_output = _output(seq)

    def generate(self, prompts: str | list[int] | list, params: SamplingParams | None = None) -> list[RequestOutput]:
        """Generates for one prompt or a list (batched together, continuous batching)."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        plist = [prompts] if single else list(prompts)
        seqs = [self.engine.add_request(self.encode(p), params or SamplingParams()) for p in plist]
        errors = []
        while any(not s.finished for s in seqs):
            errors += [out.error for out in self.engine.step() if out.error is not None]
        if errors:  # raised once the others have finished, so none is left holding a KV slot
            raise errors[0]
        return [_output(s) for s in seqs]

    def chat(self, messages: list[dict], params: SamplingParams | None = None) -> RequestOutput:
        return self.generate([self.encode_chat(messages)], params)[0]
