"""The server's inter-token latency at concurrency 1 against the engine's own, in pairs.

Starts ``specdecode serve`` in its own process and loads the same model in this one (``LLM``), then
alternates the two on the same chat prompts, one request at a time: server, local, local, server,
... (ABBA, so that a host that speeds up or slows down during the run weighs on both sides alike).
A request's per-token time is its decode time over its streamed pieces, (t_last - t_first) / (n - 1),
measured the same way on both sides (HTTP chunks arriving here; ``LLM.stream``'s pieces); greedy, so
both sides must give the same text, which is checked. Prints each pair's ratio server / local and
their median and range.

    python scripts/bench_itl.py -t 2 --pairs 8 --category writing --category qa --max-tokens 96
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time

import httpx

from specdecode import LLM, SamplingParams
from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts


def per_token(times: list[float]) -> float:
    return (times[-1] - times[0]) / (len(times) - 1)


def via_server(client: httpx.Client, url: str, model: str, text: str, max_tokens: int) -> tuple[str, float]:
    payload = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
               "temperature": 0.0, "stream": True}
    times, pieces = [], []
    with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    times.append(time.perf_counter())
                    pieces.append(piece)
    return "".join(pieces), per_token(times)


def via_engine(llm: LLM, text: str, max_tokens: int) -> tuple[str, float]:
    ids = llm.encode_chat([{"role": "user", "content": text}])
    times, pieces = [], []
    for piece in llm.stream(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens)):
        times.append(time.perf_counter())
        pieces.append(piece)
    return "".join(pieces), per_token(times)


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"bench_itl.py: the server exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    sys.exit("bench_itl.py: the server did not become healthy")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--prompts", default=DEFAULT_PROMPTS)
    p.add_argument("--category", action="append")
    p.add_argument("--limit", type=int, default=2, help="prompts per category")
    p.add_argument("--port", type=int, default=8811)
    p.add_argument("--pause", type=float, default=0.5, help="seconds between requests (idle thread pools go to sleep)")
    p.add_argument("--json-out")
    a = p.parse_args()

    prompts = load_prompts(a.prompts, a.category or ["writing", "qa"], a.limit)
    url = f"http://127.0.0.1:{a.port}"
    server = subprocess.Popen([shutil.which("specdecode") or "specdecode", "serve", "--model", a.model,
                               "-t", str(a.threads), "--spec-type", "none", "--port", str(a.port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        llm = LLM(a.model, threads=a.threads, spec_type="none")
        wait_healthy(url, server)
        client = httpx.Client(timeout=600.0)
        # One warm-up request each: first-call costs (kernel builds, allocations) out of the pairs.
        via_server(client, url, a.model, prompts[0].text, 8)
        via_engine(llm, prompts[0].text, 8)
        rows = []
        for i in range(a.pairs):
            pr = prompts[i % len(prompts)]
            order = ("server", "engine") if i % 2 == 0 else ("engine", "server")
            got = {}
            for side in order:
                time.sleep(a.pause)
                got[side] = (via_server(client, url, a.model, pr.text, a.max_tokens) if side == "server"
                             else via_engine(llm, pr.text, a.max_tokens))
            same = got["server"][0] == got["engine"][0]
            ratio = got["server"][1] / got["engine"][1]
            rows.append({"prompt": pr.id, "server_ms": 1e3 * got["server"][1], "engine_ms": 1e3 * got["engine"][1],
                         "ratio": ratio, "same_text": same})
            print(f"pair {i + 1} ({pr.category} {pr.id}, {order[0]} first): server {rows[-1]['server_ms']:.1f} ms, "
                  f"engine {rows[-1]['engine_ms']:.1f} ms per token, ratio {ratio:.3f}, same text: {same}", flush=True)
        ratios = [r["ratio"] for r in rows]
        print(f"server / engine per-token time: median {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f}, {len(ratios)} pairs); "
              f"same text in {sum(r['same_text'] for r in rows)}/{len(rows)}")
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump({"args": vars(a), "pairs": rows}, f, indent=1)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
