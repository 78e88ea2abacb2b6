"""The ``specdecode`` command line: generate, bench, serve, bench-serve, pull, models, train-head,
attach-mtp. Flags mirror llama.cpp's names; the shared ones and their defaults live in args.py."""
from __future__ import annotations

import argparse
import json
import os
import sys
from .args import add_model_args, add_sampling_args, add_spec_args, engine_config, sampling_params
from .errors import SpecDecodeError

def cmd_generate(a) -> int:
    from .llm import LLM

    params = sampling_params(a)  # validate before the (slow) model load
    llm = LLM(engine_config=engine_config(a))
    prompt = llm.encode_chat([{"role": "user", "content": a.chat}]) if a.chat is not None else a.prompt
    if a.json:
        for _ in llm.stream(prompt, params):
            pass
        o = llm.last_output
        out = {"text": o.text, "token_ids": o.token_ids, "prompt_token_ids": o.prompt_token_ids,
               "finish_reason": o.finish_reason, "stats": o.stats}
        if o.logprobs is not None:
            out["logprobs"] = [{"token_id": e.token_id, "token": llm.tokenizer.decode([e.token_id]),
                                "logprob": e.logprob, "top": [[i, lp] for i, lp in e.top]} for e in o.logprobs]
        print(json.dumps(out))
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

    from .train.cli import add_train_parser

    add_bench_parser(sub)
    add_attach_mtp_parser(sub)
    add_serve_parser(sub)
    add_bench_serve_parser(sub)
    add_train_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecDecodeError as e:
        print(f"specdecode: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:  # an optional dependency (matplotlib for --plot, ...)
        if not e.name or e.name.split(".")[0] == "specdecode":
            raise
        print(f"specdecode: error: this needs the {e.name.split('.')[0]} package: run `./install.sh bench` "
              f"(or pip install {e.name.split('.')[0]})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("specdecode: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`specdecode generate ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not raise again
        return 141


if __name__ == "__main__":
    sys.exit(main())
