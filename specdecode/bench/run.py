"""Runs a prompt set through several speculative configurations in one process.

The target (and any draft model) is loaded once and shared; for every prompt all configurations run
back to back, so slow drifts of a shared machine hit them alike, in an order that reverses every other
prompt. Speed-ups are ratios measured in the same run on the same prompts.

A prompt with several user turns (MT-bench's) runs as a conversation, as Spec-Bench's evaluation runs
it: each turn's prompt is the conversation so far, the configuration's own earlier answers included,
and each turn is one record. Lossless decoding makes every configuration's conversation the same as
none's (a record whose tokens differ from none's says otherwise)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable

from ..config import EngineConfig, SpecConfig, spec_members
from ..llm import LLM
from ..sampling_params import SamplingParams
from .prompts import Prompt


def parse_configs(text: str, base: SpecConfig) -> list[tuple[str, SpecConfig]]:
    """``--spec-types`` -> [(label, SpecConfig)]. Entries are comma-separated spec types (a chain of
    drafters joined with ``+``: ``suffix+draft``), each optionally
    with settings in parentheses: EAGLE trees as ``eagle3(num_steps,eagle_topk,num_draft_tokens)``,
    anything else as SpecConfig fields ``draft(quant_draft=int4,draft_max=4)``. Settings not given
    come from ``base`` (the command's flags)."""
    from dataclasses import fields

    from ..errors import InvalidRequestError

    types = {f.name: f.type for f in fields(SpecConfig)}
    out = []
    for entry in re.findall(r"[^,()\s]+(?:\([^)]*\))?", text):
        name, _, args = entry.partition("(")
        args = [a.strip() for a in args.rstrip(")").split(",") if a.strip()]
        over: dict = {"spec_type": name.replace("+", ",")}
        if args and all(a.isdigit() for a in args) and name in ("eagle", "eagle3") and len(args) == 3:
            over.update(zip(("num_steps", "eagle_topk", "num_draft_tokens"), map(int, args)))
        else:
            for a in args:
                key, eq, val = a.partition("=")
                key = key.strip().replace("-", "_")
                if not eq or key not in types or key == "spec_type":
                    raise InvalidRequestError(f"bad setting {a!r} in --spec-types entry {entry!r} "
                                              f"(use eagle3(steps,topk,tokens) or field=value)")
                kind = types[key] if isinstance(types[key], str) else types[key].__name__
                over[key] = (val.lower() in ("1", "true", "yes") if kind.startswith("bool") else
                             int(val) if kind.startswith("int") else float(val) if kind.startswith("float") else val)
        spec = replace(base, **over)
        out.append((entry if args else config_label(spec), spec))
    return out


def config_label(spec: SpecConfig) -> str:
    if spec.spec_type == "none":
        return "none"
    label = spec.spec_type.replace(",", "+")
    if spec.draft_fixed:
        label += f"(k={spec.draft_max})"
    if spec.spec_type in ("eagle", "eagle3"):  # (a chain keeps its plain label)
        label += f"({spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens})"
    return label


def run_bench(engine_cfg: EngineConfig, specs: list[tuple[str, SpecConfig]], prompts: list[Prompt],
              params: SamplingParams, progress: bool = True, warmup: bool = True,
              on_prompt: Callable[[list[dict]], None] | None = None, turns: int | None = None) -> list[dict]:
    """Records, one per (prompt, turn, configuration). ``specs``: (label, configuration) pairs, as
    ``parse_configs`` gives; the rest as bench_llms."""
    return bench_llms(build_llms(engine_cfg, specs), prompts, params, progress, warmup, on_prompt, turns)


def build_llms(engine_cfg: EngineConfig, specs: list[tuple[str, SpecConfig]]) -> dict[str, LLM]:
    """{label: LLM}, "none" first, all sharing one target model (and one draft model per name)."""
    from ..loader import load_checkpoint, weight_quant
    from ..store import resolve_model

    base = LLM(engine_config=replace(engine_cfg, spec=SpecConfig(spec_type="none")))
    model, tok = base.engine.model, base.engine.tokenizer
    drafts: dict[str, tuple] = {}
    llms: dict[str, LLM] = {"none": base}
    for label, spec in specs:
        if label in llms:
            continue
        draft = None
        if spec.model_draft and ("draft" in spec_members(spec.spec_type) or spec.spec_type == "auto"):
            key = (spec.model_draft, spec.quant_draft)
            if key not in drafts:
                drafts[key] = load_checkpoint(resolve_model(spec.model_draft), base.engine.dtype,
                                              base.engine.device, weight_quant(spec.quant_draft, base.engine.device),
                                              engine_cfg.weight_cache)
            draft = drafts[key]
        llms[label] = LLM(engine_config=replace(engine_cfg, spec=spec), _model=model, _tokenizer=tok, _draft=draft)
    return llms


def in_turns(items: list, i: int) -> list:
    """``items`` in their order for an even ``i`` (a prompt, a round), reversed for an odd one (ABBA):
    whatever running second gains or loses from the run before it falls on each configuration alike."""
    return items if i % 2 == 0 else items[::-1]


def bench_llms(llms: dict[str, LLM], prompts: list[Prompt], params: SamplingParams, progress: bool = True,
               warmup: bool = True, on_prompt: Callable[[list[dict]], None] | None = None,
               turns: int | None = None) -> list[dict]:
    """Every configuration on each prompt in turn, in the given order on even prompts and in reverse on
    odd ones; records, one per (prompt, turn, configuration).
    ``turns``: the first N user turns of each prompt (None: all of them); ``on_prompt(records so far)``
    is called after each prompt."""
    from tqdm import tqdm

    if warmup:  # first calls pay one-off costs (allocation, calibration): keep them out of the figures
        for llm in llms.values():
            llm.generate(llm.encode_chat([{"role": "user", "content": prompts[0].turns[0]}]),
                         replace(params, max_tokens=8))
    records = []
    for i, p in enumerate(tqdm(prompts, desc="bench", unit="prompt", disable=not progress)):
        for label, llm in in_turns(list(llms.items()), i):
            messages: list[dict] = []
            for turn, text in enumerate(p.turns[:turns]):
                messages.append({"role": "user", "content": text})
                o = llm.generate(llm.encode_chat(messages), params)[0]
                messages.append({"role": "assistant", "content": o.text})
                records.append(_record(p, turn, label, o))
        if on_prompt is not None:
            on_prompt(records)
    return records


def _record(p: Prompt, turn: int, label: str, o) -> dict:
    s = o.stats
    n = s["completion_tokens"]
    return {
        "prompt_id": p.id, "turn": turn, "category": p.category, "config": label,
        "prompt_tokens": s["prompt_tokens"], "completion_tokens": n,
        "ttft_s": s["time_to_first_token_s"],
        "decode_s": (n - 1) / s["decode_tokens_per_s"] if s["decode_tokens_per_s"] else 0.0,
        "spec": s["spec"], "token_ids": o.token_ids,
    }
