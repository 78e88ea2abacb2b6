"""Runs a prompt set through several speculative configurations in one process.

The target (and any draft model) is loaded once and shared; for every prompt all configurations run
back to back, so slow drifts of a shared machine hit them alike. Speed-ups are ratios measured in
the same run on the same prompts."""
from __future__ import annotations

from dataclasses import replace

from ..config import EngineConfig, SpecConfig
from ..llm import LLM
from ..sampling_params import SamplingParams
from .prompts import Prompt


def config_label(spec: SpecConfig) -> str:
    if spec.spec_type == "none":
        return "none"
    label = spec.spec_type
    if spec.draft_fixed:
        label += f"(k={spec.draft_max})"
    if spec.spec_type in ("eagle", "eagle3"):
        label += f"({spec.num_steps},{spec.eagle_topk},{spec.num_draft_tokens})"
    return label


def run_bench(engine_cfg: EngineConfig, specs: list[SpecConfig], prompts: list[Prompt], params: SamplingParams,
              progress: bool = True, warmup: bool = True) -> list[dict]:
    from tqdm import tqdm

    from ..loader import load_checkpoint
    from ..store import resolve_model

    base = LLM(engine_config=replace(engine_cfg, spec=SpecConfig()))
    model, tok = base.engine.model, base.engine.tokenizer
    drafts: dict[str, tuple] = {}
    llms: dict[str, LLM] = {"none": base}
    for spec in specs:
        label = config_label(spec)
        if label in llms:
            continue
        draft = None
        if spec.spec_type == "draft":
            if spec.model_draft not in drafts:
                drafts[spec.model_draft] = load_checkpoint(resolve_model(spec.model_draft), base.engine.dtype,
                                                           base.engine.device, base.engine.weight_quant())
            draft = drafts[spec.model_draft]
        llms[label] = LLM(engine_config=replace(engine_cfg, spec=spec), _model=model, _tokenizer=tok, _draft=draft)
    encoded = [base.encode_chat([{"role": "user", "content": p.text}]) for p in prompts]
    if warmup:  # first calls pay one-off costs (allocation, calibration): keep them out of the figures
        for llm in llms.values():
            llm.generate(encoded[0], replace(params, max_tokens=8))
    records = []
    for p, ids in tqdm(list(zip(prompts, encoded)), desc="bench", unit="prompt", disable=not progress):
        for label, llm in llms.items():
            o = llm.generate(ids, params)[0]
            s = o.stats
            n = s["completion_tokens"]
            records.append({
                "prompt_id": p.id, "category": p.category, "config": label,
                "prompt_tokens": s["prompt_tokens"], "completion_tokens": n,
                "ttft_s": s["time_to_first_token_s"],
                "decode_s": (n - 1) / s["decode_tokens_per_s"] if s["decode_tokens_per_s"] else 0.0,
                "spec": s["spec"], "token_ids": o.token_ids,
            })
    return records
