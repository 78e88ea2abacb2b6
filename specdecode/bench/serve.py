"""``specdecode bench-serve``: load test of the HTTP server at several concurrencies.

Drives a running server (``--url``) or, per configuration of ``--spec-types``, starts one in this
process on 127.0.0.1 (target weights loaded once and shared) and drives it from a child process.
Each concurrency level sends the prompt set as streamed chat requests, ``c`` at a time, starting cold
(a fresh engine, or the running server's prefix cache reset); with ``--turns`` each prompt is a
conversation of its user turns, turn by turn (``run_level``). A level reports request throughput, output
tok/s, time to first token, inter-token latency (the gap between streamed chunks: with speculation one
chunk can carry several tokens) and time per output token, p50 / p99 (and the longest inter-token
wait), and τ from the servers' per-request ``spec`` figures.
The client runs in a process of its own in both cases: in the server's process its Python (parsing
every streamed chunk of c streams) would hold the GIL that the engine thread takes back after each of
its native calls, delaying a step the more, the more calls it makes, which biased the comparison of
configurations (docs/benchmarks.md, round 36). Client and server still share the CPU, as on any one
machine."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import replace

from ..args import (add_filter_args, add_model_args, add_prefill_args, add_prefix_cache_args, add_spec_args,
                    engine_config, spec_config)
from ..errors import SpecDecodeError
from .prompts import DEFAULT_PROMPTS, Prompt, load_prompts, parse_turns
from .serve_report import add_round, combine_rounds, format_table, plot, summarize_level

_SSE_EOL = re.compile(r"\r\n|\r|\n")


def add_bench_serve_parser(sub) -> None:
    b = sub.add_parser("bench-serve", help="throughput and latency of the server at concurrency 1, 2, 4, 8")
    add_model_args(b)
    add_spec_args(b)
    b.add_argument("--url", help="benchmark this running server (default: start one per --spec-types entry)")
    b.add_argument("--api-key", default=os.environ.get("SPECDECODE_API_KEY"))
    b.add_argument("--label", help="configuration name for --url results (default: the served model name)")
    b.add_argument("--spec-types", default="none,ngram",
                   help="in-process configurations, compared with the first (settings as in bench: draft(draft_max=4))")
    b.add_argument("--concurrency", default="1,2,4,8")
    b.add_argument("--requests", type=int, default=16,
                   help="requests per level (at least 2x the concurrency); conversations with --turns")
    b.add_argument("--prompts", default=DEFAULT_PROMPTS, help="JSONL: Spec-Bench format or {'prompt': ...}")
    b.add_argument("--category", action="append")
    b.add_argument("--limit", type=int, default=None, help="first N prompts of each category")
    b.add_argument("--turns", type=parse_turns, default=1, metavar="N|all",
                   help="user turns per prompt (default 1): with more, each prompt is a conversation, its answers "
                        "in the history of its next turn, sent once every conversation of the level has its "
                        "answer to the turn before (users who reply after the others were served)")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--temperature", type=float, default=0.0)
    add_filter_args(b)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-num-seqs", type=int, default=None, help="in-process slots (default: the top concurrency)")
    add_prefix_cache_args(b)
    add_prefill_args(b)
    b.add_argument("--rounds", type=int, default=1,
                   help="run every configuration's levels this many times, configurations in turns, their order "
                        "reversed every other round; report each figure's median, tok/s's range, and 'vs first' as "
                        "the median of the rounds' paired ratios")
    b.add_argument("--warm-levels", action="store_true",
                   help="one server per configuration for all levels (default: each level starts cold, as a "
                        "fresh server: the levels ask the same prompts, which a warm server has cached)")
    b.add_argument("--json-out")
    b.add_argument("--plot")
    b.set_defaults(func=cmd_bench_serve)


# -- one level --------------------------------------------------------------------------------------
async def _sse_lines(r):
    """The lines of a server-sent event stream. SSE ends lines with CR, LF or CRLF only; httpx's
    aiter_lines splits like str.splitlines, also at U+2028, U+2029 and U+0085, which JSON leaves
    unescaped: a generated text holding one would cut its event in two."""
    rest = ""
    async for text in r.aiter_text():
        *lines, rest = _SSE_EOL.split(rest + text)
        for line in lines:
            yield line
    if rest:
        yield rest


async def _request(client, url: str, payload: dict) -> dict:
    t0 = time.perf_counter()
    chunks, text, use, spec = [], [], None, None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise SpecDecodeError(f"server answered {r.status_code}: {(await r.aread()).decode()[:200]}")
        async for line in _sse_lines(r):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                raise SpecDecodeError(f"server error: {obj['error'].get('message')}")
            if obj.get("usage"):
                use, spec = obj["usage"], obj.get("spec")
            delta = "".join(c.get("delta", {}).get("content") or "" for c in obj["choices"])
            if delta:
                chunks.append(time.perf_counter())
                text.append(delta)
    end = time.perf_counter()
    return {"ttft_s": (chunks[0] - t0) if chunks else end - t0, "e2e_s": end - t0,
            "itl_s": [b - a for a, b in zip(chunks, chunks[1:])],
            "prompt_tokens": use["prompt_tokens"] if use else 0,
            "completion_tokens": use["completion_tokens"] if use else 0, "spec": spec or {}, "text": "".join(text)}


async def run_level(url: str, model: str, prompts: list[Prompt], concurrency: int, n: int, params: dict,
                    api_key: str | None = None, turns: int | None = 1) -> tuple[list[dict], float]:
    """``n`` conversations (prompts in turn) of their prompt's first ``turns`` user turns (None: all;
    1: single requests), ``concurrency`` requests in flight; returns (records, wall seconds). Turn by
    turn: a conversation's turn t goes out, its earlier turns and answers as history, once every
    conversation has its answer to turn t - 1, as users who reply after the others were served (with
    more conversations than the server's slots, a next turn's history has left its slot by then)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    convs = [prompts[i % len(prompts)] for i in range(n)]
    history: list[list[dict]] = [[] for _ in convs]
    records: list[dict] = []

    async def client_loop(client, todo, t):
        for i in todo:
            history[i].append({"role": "user", "content": convs[i].turns[t]})
            payload = {"model": model, "messages": list(history[i]), "stream": True,
                       "stream_options": {"include_usage": True}, **params}
            rec = await _request(client, url, payload)
            history[i].append({"role": "assistant", "content": rec.pop("text")})
            records.append({"prompt": convs[i].id, **({"turn": t} if turns != 1 else {}), **rec})

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=None, headers=headers, limits=limits) as client:
        t0 = time.perf_counter()
        for t in range(max(len(p.turns) for p in convs) if turns is None else turns):
            todo = iter([i for i, p in enumerate(convs) if t < len(p.turns)])
            await asyncio.gather(*(client_loop(client, todo, t) for _ in range(concurrency)))
        return records, time.perf_counter() - t0


async def reset_prefix_cache(url: str, api_key: str | None = None) -> bool:
    """POST /reset_prefix_cache (vLLM's route); False if the server has no such route."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=60) as client:
        r = await client.post(f"{url}/reset_prefix_cache", headers=headers)
    if r.status_code in (404, 405):
        return False
    if r.status_code != 200:
        raise SpecDecodeError(f"server answered {r.status_code} to /reset_prefix_cache: {r.text[:200]}")
    return True


async def bench_url(url: str, model: str, prompts: list[Prompt], levels: list[int], n: int, params: dict,
                    api_key: str | None = None, progress: bool = False, reset: bool = False,
                    turns: int | None = 1) -> tuple[dict, list[dict]]:
    """{concurrency: summary} and the per-request records, after one short warm-up request. ``reset``:
    the server's prefix cache is emptied before each level, whose prompts an earlier level asked.
    ``turns``: as ``run_level``'s."""
    await run_level(url, model, prompts, 1, 1, {**params, "max_tokens": 8}, api_key)
    summary, records = {}, []
    for c in levels:
        if reset and not await reset_prefix_cache(url, api_key):
            print(f"warning: {url} has no /reset_prefix_cache route: a level may find the prompts of the levels "
                  "before it cached", file=sys.stderr)
            reset = False
        recs, wall = await run_level(url, model, prompts, c, max(n, 2 * c), params, api_key, turns)
        summary[c] = summarize_level(recs, wall)
        records += [{"concurrency": c, **{k: v for k, v in r.items() if k != "itl_s"}} for r in recs]
        if progress:
            print(f"  concurrency {c}: {summary[c]['output_tokens_per_s']} tok/s", file=sys.stderr)
    return summary, records


def bench_engines(engines, prompts, levels, n, params, progress=False, warm_levels=False,
                  rounds: int = 1, turns: int | None = 1) -> tuple[dict, list[dict]]:
    """``engines``: (label, factory) pairs; each factory builds an Engine, served while it is measured.
    Every level gets an engine of its own, as a server just started: the levels ask the same prompts,
    and an engine that served an earlier level would hold them in its prefix cache and their answers
    in its cross-request drafters. ``warm_levels``: one engine per configuration, levels in turn.
    ``rounds``: the whole set again, configurations in turns, their order reversed every other round
    (ABBA: in one process the configuration served second often ran slower, docs/benchmarks.md round
    44), so that a machine's drift and the order reach them alike; each level's figures are then
    combined by ``combine_rounds``."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from ..server.app import create_app
    from ..server.background import BackgroundServer
    from .run import in_turns

    if rounds < 1:
        raise SpecDecodeError(f"--rounds must be >= 1, got {rounds}")
    runs: dict[str, dict[int, list[dict]]] = {label: {} for label, _ in engines}
    records = []
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as client:  # the module doc says why
        for r in range(rounds):
            for label, factory in in_turns(list(engines), r):
                if progress:
                    print(f"{label}" + (f" (round {r + 1})" if rounds > 1 else "") + ":", file=sys.stderr)
                for group in ([levels] if warm_levels else [[c] for c in levels]):
                    engine = factory()
                    with BackgroundServer(create_app(engine, ["bench"])) as srv:
                        summary, recs = client.submit(_drive, srv.url, prompts, group, n, params, progress,
                                                      turns).result()
                    records += add_round(runs[label], summary, recs, label, r, rounds)
                    del engine  # its KV cache goes before the next one allocates its own
    return combine_rounds(runs), records


def _drive(url: str, prompts: list[Prompt], levels: list[int], n: int, params: dict, progress: bool,
           turns: int | None):
    """bench_url on a fresh engine's server, from the client's process (its prefix cache is reset
    before each level: the warm-up's prompt is a level's too)."""
    return asyncio.run(bench_url(url, "bench", prompts, levels, n, params, progress=progress, reset=True,
                                 turns=turns))


def cmd_bench_serve(a: argparse.Namespace) -> int:
    try:
        levels = [int(c) for c in a.concurrency.split(",") if c.strip()]
    except ValueError:
        raise SpecDecodeError(f"--concurrency takes comma-separated integers, got {a.concurrency!r}") from None
    if not levels or min(levels) < 1:
        raise SpecDecodeError("--concurrency levels must be >= 1")
    if a.rounds < 1:
        raise SpecDecodeError(f"--rounds must be >= 1, got {a.rounds}")
    prompts = load_prompts(a.prompts, a.category, a.limit)
    params = {"max_tokens": a.max_tokens, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
              "min_p": a.min_p, "seed": a.seed}
    progress = sys.stderr.isatty()
    from .host import host_info, host_line
    host = None if a.url else host_info(a.threads)  # a server at --url runs on a machine of its own
    if host:
        print(host_line(host), file=sys.stderr)
    if a.url:
        results, records = _bench_running(a, prompts, levels, params, progress)
    else:
        cfg = engine_config(a, max_num_seqs=a.max_num_seqs or max(levels))
        results, records = bench_engines(_engine_factories(a, cfg, spec_config(a)), prompts, levels,
                                         a.requests, params, progress, a.warm_levels, a.rounds, a.turns)
    print(format_table(results))
    if a.json_out:
        meta = {"argv": sys.argv, "url": a.url, "model": a.model, "spec_types": a.spec_types, "levels": levels,
                "requests_per_level": a.requests, "n_prompts": len(prompts), "rounds": a.rounds,
                "turns": a.turns or "all", **params,
                "host": host}
        with open(a.json_out, "w") as f:
            json.dump({"meta": meta, "results": results, "records": records}, f, indent=1)
    if a.plot:
        plot(a.plot, results)
    return 0


def _bench_running(a, prompts, levels, params, progress):
    import httpx

    url = a.url.rstrip("/")
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    runs: dict[int, list[dict]] = {}
    records = []
    try:
        model = httpx.get(f"{url}/v1/models", headers=headers, timeout=30).raise_for_status().json()["data"][0]["id"]
        label = a.label or model
        for r in range(a.rounds):
            summary, recs = asyncio.run(bench_url(url, model, prompts, levels, a.requests, params, a.api_key, progress,
                                                  reset=not a.warm_levels, turns=a.turns))
            records += add_round(runs, summary, recs, label, r, a.rounds)
    except httpx.HTTPError as e:
        raise SpecDecodeError(f"{url}: {e}") from None
    return combine_rounds({label: runs}), records


def _engine_factories(a, cfg, base_spec):
    """Target weights are loaded once; each configuration gets its own engine (KV cache, proposer)."""
    from ..llm import LLM
    from .run import parse_configs

    shared: dict = {}

    def factory(spec):
        def build():
            llm = LLM(engine_config=replace(cfg, spec=spec), _model=shared.get("model"), _tokenizer=shared.get("tok"))
            shared.setdefault("model", llm.engine.model)
            shared.setdefault("tok", llm.engine.tokenizer)
            return llm.engine
        return build

    return [(label, factory(s)) for label, s in parse_configs(a.spec_types, base_spec)]
