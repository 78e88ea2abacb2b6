"""``specdecode bench``: arguments and the command."""
from __future__ import annotations

import argparse
import sys

from ..args import add_filter_args, add_model_args, add_spec_args, engine_config, spec_config
from .prompts import DEFAULT_PROMPTS, load_prompts, parse_turns


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="speculative vs plain decoding on a prompt set (same process, same prompts)")
    add_model_args(b)
    add_spec_args(b)
    b.add_argument("--spec-types", default="ngram-simple,ngram",
                   help="comma-separated configurations to compare with none, each with optional settings: "
                        "draft,ngram,eagle3(3,2,6),draft(quant_draft=int4)")
    b.add_argument("--prompts", default=DEFAULT_PROMPTS, help="JSONL: Spec-Bench format or {'prompt': ...}")
    b.add_argument("--category", action="append", help="keep these categories (repeatable; mt_bench = MT-bench's 8)")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each category")
    b.add_argument("--turns", type=parse_turns, default=None, metavar="N|all",
                   help="user turns per prompt: all (default; MT-bench's two, run as a conversation, as "
                        "Spec-Bench does) or the first N")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--temperature", type=float, default=0.0)
    add_filter_args(b)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--json-out")
    b.add_argument("--plot")
    b.set_defaults(func=cmd_bench)


def cmd_bench(a: argparse.Namespace) -> int:
    from ..sampling_params import SamplingParams
    from .host import host_info, host_line
    from .report import format_table, plot, summarize, write_json
    from .run import parse_configs, run_bench

    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p,
                            max_tokens=a.max_tokens, seed=a.seed)
    prompts = load_prompts(a.prompts, a.category, a.limit)
    specs = parse_configs(a.spec_types, spec_config(a))
    meta = {"argv": sys.argv, "model": a.model, "spec_types": a.spec_types, "temperature": a.temperature,
            "top_p": a.top_p, "top_k": a.top_k, "min_p": a.min_p,
            "max_tokens": a.max_tokens, "prompts": a.prompts, "n_prompts": len(prompts), "turns": a.turns or "all",
            "host": host_info(a.threads)}
    print(host_line(meta["host"]), file=sys.stderr)

    def save(records: list[dict]) -> None:  # after every prompt: an interrupted run keeps what it measured
        if a.json_out:
            write_json(a.json_out, meta, records, summarize(records))
    records = run_bench(engine_config(a), specs, prompts, params, progress=sys.stderr.isatty(), on_prompt=save,
                        turns=a.turns)
    summary = summarize(records)
    print(format_table(summary))
    save(records)
    if a.plot:
        plot(a.plot, records, summary)
    return 0
