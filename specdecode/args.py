"""Command-line arguments shared by the subcommands, and the configurations they build. Every default
is read from the frozen configs (config.py, sampling_params.py): a flag never defines its own."""
from __future__ import annotations

import argparse
from dataclasses import fields

from .config import DRAFTERS, EngineConfig, SpecConfig
from .sampling_params import SamplingParams

_SPEC = {f.name: f.default for f in fields(SpecConfig)}
_ENG = {f.name: f.default for f in fields(EngineConfig) if f.name != "spec"}
_SAMP = {f.name: f.default for f in fields(SamplingParams)}


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=_ENG["model"], help="known name, GGUF file or HF directory")
    p.add_argument("--dtype", default=_ENG["dtype"], help="auto | float32 | bfloat16 | float16")
    p.add_argument("--quant", default=_ENG["quant"],
                   help="weight format of the linear layers: auto (closest to the GGUF's own bit width), none, "
                        "or a format of layers/quant (int4, int8)")
    p.add_argument("--device", default=_ENG["device"], help="auto | cpu | cuda")
    p.add_argument("--kv-cache-dtype", default=_ENG["kv_cache_dtype"],
                   help="auto | float32 | bfloat16 | float16 (auto: bfloat16 for quantized weights on CPU)")
    p.add_argument("--threads", "-t", type=int, default=_ENG["threads"],
                   help="CPU threads (default: one per physical core this process may use, performance cores only "
                        "on a hybrid CPU, within its cgroup's CPU quota; OMP_NUM_THREADS decides where set)")
    p.add_argument("--no-weight-cache", dest="weight_cache", action="store_false", default=_ENG["weight_cache"],
                   help="convert a quantized GGUF's weights at every load instead of reading the converted copy "
                        "an earlier load saved under ~/.cache/specdecode/weights")
    p.add_argument("--ctx-size", "-c", dest="max_model_len", type=int, default=_ENG["max_model_len"])
    p.add_argument("--attention-backend", default=_ENG["attention_backend"],
                   help="auto (cpu-native, batch-invariant, on a CPU where the native kernels build; else "
                        "torch-sdpa), cpu-native, torch-sdpa")


def add_prefix_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-prefix-cache", dest="enable_prefix_caching", action="store_false",
                   default=_ENG["enable_prefix_caching"], help="always prefill whole prompts")
    p.add_argument("--cache-ram", dest="prompt_cache_mib", type=int, default=_ENG["prompt_cache_mib"], metavar="MIB",
                   help="MiB of host memory for the KV of cached prompts whose KV slot another request took "
                        "(0: keep a prompt only while its slot is free)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Scheduling and cache knobs (EngineConfig): serving and benchmarking commands."""
    p.add_argument("--max-num-seqs", "--parallel", "-np", dest="max_num_seqs", type=int, default=_ENG["max_num_seqs"],
                   help="concurrent sequences (KV-cache slots); more requests wait in a queue")
    p.add_argument("--kv-cache-tokens", type=int, default=_ENG["kv_cache_tokens"],
                   help="total KV-cache budget in tokens, shared by the slots (caps the context per slot)")
    add_prefix_cache_args(p)
    add_prefill_args(p)


def add_prefill_args(p: argparse.ArgumentParser) -> None:
    """How prompts share steps with decoding requests (EngineConfig)."""
    p.add_argument("--prefill-chunk", type=int, default=_ENG["prefill_chunk"],
                   help="prompt tokens per forward (bounds a long prompt's stall of running decodes)")
    p.add_argument("--max-prefill-tokens", type=int, default=_ENG["max_prefill_tokens"],
                   help="prompt tokens prefilled in one step while at least as many requests decode as "
                        "prompts wait (bounds the inter-token latency a joining request's prefill adds; 0: no limit)")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec-type", default=_SPEC["spec_type"],
                   help=f"auto (every drafter available for the model, chosen per step), none, one of "
                        f"{', '.join(DRAFTERS)}, or a comma-separated list of them")
    p.add_argument("--model-draft", "-md", default=_SPEC["model_draft"])
    p.add_argument("--quant-draft", default=_SPEC["quant_draft"],
                   help="weight format of the draft model's linear layers (as --quant)")
    p.add_argument("--draft-max", type=int, default=_SPEC["draft_max"],
                   help="most tokens a model drafter (draft, draft-mtp) drafts per step")
    p.add_argument("--draft-min", type=int, default=_SPEC["draft_min"])
    p.add_argument("--draft-p-min", type=float, default=_SPEC["draft_p_min"])
    p.add_argument("--draft-vocab", default=_SPEC["draft_vocab"], choices=("auto", "full"),
                   help="the draft model's LM head: auto keeps the rows of the target's EAGLE-3 draft vocabulary "
                        "(--spec-head or the bundled head) when there is one, full keeps all")
    p.add_argument("--draft-fixed", action="store_true",
                   help="always draft each drafter's most tokens (--draft-max for models; no cost model)")
    p.add_argument("--no-calibration-cache", dest="calibration_cache", action="store_false",
                   default=_SPEC["calibration_cache"],
                   help="measure the target's verify costs afresh instead of starting from the curve an earlier "
                        "run measured for this model file on this machine")
    p.add_argument("--spec-merge", default=_SPEC["spec_merge"], choices=("auto", "always", "off"),
                   help="a chain (auto, a list) verifies a head's or draft model's draft and an n-gram or suffix "
                        "draft as one tree: auto when that pays, always, or off")
    p.add_argument("--spec-ngram-size-n", dest="ngram_size_n", type=int, default=_SPEC["ngram_size_n"])
    p.add_argument("--spec-ngram-size-m", dest="ngram_size_m", type=int, default=_SPEC["ngram_size_m"],
                   help="most tokens ngram-simple and ngram draft per step")
    p.add_argument("--prompt-lookup-min", type=int, default=_SPEC["prompt_lookup_min"])
    p.add_argument("--prompt-lookup-max", type=int, default=_SPEC["prompt_lookup_max"])
    p.add_argument("--num-steps", type=int, default=_SPEC["num_steps"])
    p.add_argument("--eagle-topk", type=int, default=_SPEC["eagle_topk"])
    p.add_argument("--num-draft-tokens", type=int, default=_SPEC["num_draft_tokens"])
    p.add_argument("--spec-head", dest="head", default=_SPEC["head"])
    p.add_argument("--spec-ngram-mod-n-match", dest="ngram_mod_n_match", type=int, default=_SPEC["ngram_mod_n_match"])
    p.add_argument("--spec-ngram-mod-n-min", dest="ngram_mod_n_min", type=int, default=_SPEC["ngram_mod_n_min"])
    p.add_argument("--spec-ngram-mod-n-max", dest="ngram_mod_n_max", type=int, default=_SPEC["ngram_mod_n_max"])
    p.add_argument("--suffix-decoding-max-tree-depth", dest="suffix_max_tree_depth", type=int,
                   default=_SPEC["suffix_max_tree_depth"])
    p.add_argument("--suffix-decoding-max-cached-requests", dest="suffix_max_cached_requests", type=int,
                   default=_SPEC["suffix_max_cached_requests"])
    p.add_argument("--suffix-decoding-max-spec-factor", dest="suffix_max_spec_factor", type=float,
                   default=_SPEC["suffix_max_spec_factor"])
    p.add_argument("--suffix-decoding-min-token-prob", dest="suffix_min_token_prob", type=float,
                   default=_SPEC["suffix_min_token_prob"])


def add_filter_args(p: argparse.ArgumentParser) -> None:
    """The sampling filters (generate, serve, and the benchmarks' sampled runs)."""
    p.add_argument("--top-p", type=float, default=_SAMP["top_p"])
    p.add_argument("--top-k", type=int, default=_SAMP["top_k"])
    p.add_argument("--min-p", type=float, default=_SAMP["min_p"])


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=_SAMP["max_tokens"])
    p.add_argument("--temperature", "--temp", type=float, default=_SAMP["temperature"])
    add_filter_args(p)
    p.add_argument("--seed", type=int, default=_SAMP["seed"])
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--repeat-penalty", dest="repetition_penalty", type=float, default=_SAMP["repetition_penalty"],
                   help="divide (multiply, if negative) the logit of every token in the prompt or output so far")
    p.add_argument("--presence-penalty", type=float, default=_SAMP["presence_penalty"])
    p.add_argument("--frequency-penalty", type=float, default=_SAMP["frequency_penalty"])
    p.add_argument("--logprobs", type=int, default=_SAMP["logprobs"], metavar="K",
                   help="with --json: each output token's log probability and the K most likely tokens")


def spec_config(a) -> SpecConfig:
    return SpecConfig(**{k: getattr(a, k) for k in _SPEC if hasattr(a, k)})


def engine_config(a, **over) -> EngineConfig:
    kw = {k: getattr(a, k) for k in _ENG if hasattr(a, k)}
    kw.update(over)
    return EngineConfig(spec=spec_config(a), **kw)


def sampling_params(a) -> SamplingParams:
    return SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                          min_p=a.min_p, seed=a.seed, stop=tuple(a.stop), logprobs=a.logprobs,
                          repetition_penalty=a.repetition_penalty, presence_penalty=a.presence_penalty,
                          frequency_penalty=a.frequency_penalty)
