"""The ``specdecode`` command line: generate, bench, serve, bench-serve, pull, models (train-head
comes with its issue). Flags mirror llama.cpp's names; defaults come from config.py and sampling_params.py."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

from .config import SPEC_TYPES, EngineConfig, SpecConfig
from .errors import SpecDecodeError
from .sampling_params import SamplingParams

_SPEC = {f.name: f.default for f in fields(SpecConfig)}
_ENG = {f.name: f.default for f in fields(EngineConfig) if f.name != "spec"}
_SAMP = {f.name: f.default for f in fields(SamplingParams)}


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=_ENG["model"], help="known name, GGUF file or HF directory")
    p.add_argument("--dtype", default=_ENG["dtype"], help="auto | float32 | bfloat16 | float16")
    p.add_argument("--quant", default=_ENG["quant"], choices=("auto", "none", "int8", "int4"),
                   help="weight format of the linear layers (auto: closest to the GGUF's own bit width)")
    p.add_argument("--device", default=_ENG["device"], help="auto | cpu | cuda")
    p.add_argument("--kv-cache-dtype", default=_ENG["kv_cache_dtype"],
                   help="auto | float32 | bfloat16 | float16 (auto: bfloat16 for quantized weights on CPU)")
    p.add_argument("--threads", "-t", type=int, default=_ENG["threads"])
    p.add_argument("--ctx-size", "-c", dest="max_model_len", type=int, default=_ENG["max_model_len"])


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec-type", default=_SPEC["spec_type"], choices=SPEC_TYPES)
    p.add_argument("--model-draft", "-md", default=_SPEC["model_draft"])
    p.add_argument("--quant-draft", default=_SPEC["quant_draft"], choices=("auto", "none", "int8", "int4"),
                   help="weight format of the draft model's linear layers (auto: closest to its GGUF's bits)")
    p.add_argument("--draft-max", type=int, default=_SPEC["draft_max"])
    p.add_argument("--draft-min", type=int, default=_SPEC["draft_min"])
    p.add_argument("--draft-p-min", type=float, default=_SPEC["draft_p_min"])
    p.add_argument("--draft-fixed", action="store_true", help="always draft --draft-max tokens (no cost model)")
    p.add_argument("--spec-ngram-size-n", dest="ngram_size_n", type=int, default=_SPEC["ngram_size_n"])
    p.add_argument("--prompt-lookup-min", type=int, default=_SPEC["prompt_lookup_min"])
    p.add_argument("--prompt-lookup-max", type=int, default=_SPEC["prompt_lookup_max"])
    p.add_argument("--num-steps", type=int, default=_SPEC["num_steps"])
    p.add_argument("--eagle-topk", type=int, default=_SPEC["eagle_topk"])
    p.add_argument("--num-draft-tokens", type=int, default=_SPEC["num_draft_tokens"])
    p.add_argument("--spec-head", dest="head", default=_SPEC["head"])


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=_SAMP["max_tokens"])
    p.add_argument("--temperature", "--temp", type=float, default=_SAMP["temperature"])
    p.add_argument("--top-p", type=float, default=_SAMP["top_p"])
    p.add_argument("--top-k", type=int, default=_SAMP["top_k"])
    p.add_argument("--min-p", type=float, default=_SAMP["min_p"])
    p.add_argument("--seed", type=int, default=_SAMP["seed"])
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def spec_config(a) -> SpecConfig:
    return SpecConfig(**{k: getattr(a, k) for k in _SPEC if hasattr(a, k)})


def engine_config(a, **over) -> EngineConfig:
    kw = {k: getattr(a, k) for k in _ENG if hasattr(a, k)}
    kw.update(over)
    return EngineConfig(spec=spec_config(a), **kw)


def sampling_params(a) -> SamplingParams:
    return SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                          min_p=a.min_p, seed=a.seed, stop=tuple(a.stop))


def cmd_generate(a) -> int:
    from .llm import LLM

    params = sampling_params(a)  # validate before the (slow) model load
    llm = LLM(engine_config=engine_config(a))
    prompt = llm.encode_chat([{"role": "user", "content": a.chat}]) if a.chat is not None else a.prompt
    if a.json:
        for _ in llm.stream(prompt, params):
            pass
        o = llm.last_output
        print(json.dumps({"text": o.text, "token_ids": o.token_ids, "prompt_token_ids": o.prompt_token_ids,
                          "finish_reason": o.finish_reason, "stats": o.stats}))
        return 0
    for delta in llm.stream(prompt, params):
        sys.stdout.write(delta)
        sys.stdout.flush()
    s = llm.last_output.stats
    line = (f"\n\n[prompt {s['prompt_tokens']} tok, completion {s['completion_tokens']} tok, "
            f"prefill {s['prefill_tokens_per_s']:.1f} tok/s, decode {s['decode_tokens_per_s']:.1f} tok/s")
    if a.spec_type != "none":
        sp = s["spec"]
        line += f", tau {sp['mean_acceptance_length']:.2f}, acceptance {100 * sp['acceptance_rate']:.0f}%"
    print(line + "]", file=sys.stderr)
    return 0


def cmd_pull(a) -> int:
    from .store import pull

    for name in a.names:
        print(pull(name))
    return 0


def cmd_models(a) -> int:
    from .store import list_models

    for row in list_models():
        mark = "cached" if row["cached"] else "-"
        print(f"{row['name']:32s} {row['size'] / 2**20:8.0f} MiB  {mark:7s} {row['path'] if row['cached'] else ''}")
    return 0


# -- attach-mtp (MTP heads, issue 5) -----------------------------------------------------------------
def cmd_attach_mtp(a) -> int:
    from .loader.mtp_ckpt import attach_mtp
    from .store import resolve_model

    print(attach_mtp(resolve_model(a.model), a.head, a.out, progress=sys.stderr.isatty()))
    return 0


def add_attach_mtp_parser(sub) -> None:
    x = sub.add_parser("attach-mtp", help="write MODEL + MTP heads as one GGUF, for --spec-type draft-mtp")
    x.add_argument("--model", "-m", required=True, help="known name or GGUF file")
    x.add_argument("--head", required=True, help="head directory (train-head --kind mtp), or a file with heads")
    x.add_argument("--out", "-o", required=True, help="the GGUF file to write")
    x.set_defaults(func=cmd_attach_mtp)
# -- end attach-mtp ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specdecode", description="Lossless speculative decoding for local LLMs")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt or a chat message")
    add_model_args(g)
    add_spec_args(g)
    add_sampling_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", "-p", help="raw prompt (no chat template)")
    src.add_argument("--chat", help="one user message, rendered with the model's chat template")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    g.set_defaults(func=cmd_generate)
    p = sub.add_parser("pull", help="download known models into the cache")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_pull)
    m = sub.add_parser("models", help="list known and cached models")
    m.set_defaults(func=cmd_models)
    from .bench.cli import add_bench_parser
    from .bench.serve import add_bench_serve_parser
    from .server.cli import add_serve_parser

    add_bench_parser(sub, add_model_args, add_spec_args)
    add_attach_mtp_parser(sub)
    add_serve_parser(sub, add_model_args, add_spec_args)
    add_bench_serve_parser(sub, add_model_args, add_spec_args)
    from .train.cli import add_train_parser

    add_train_parser(sub, add_model_args)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecDecodeError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specdecode: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
