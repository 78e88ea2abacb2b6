"""A load test of a running specdecode server: answers under load equal answers served alone, no
request is lost, clients that disconnect mid-stream free their slots.

First every prompt is sent alone (one at a time): the reference answers. Then ``--requests``
requests (the prompts in turn) at ``--concurrency``, greedy; every ``--drop-every``-th one streams
and disconnects after three chunks. Prints one JSON object: status counts, lost requests (no answer,
no error), 5xx count, how many completed answers equal the solo answer, and the server's abort
counter before and after (from /metrics).

    python scripts/load_test.py --url http://127.0.0.1:8000 --requests 64 --concurrency 8
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import httpx

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "shared/datasets/spec_bench/question.jsonl"


def load_prompts(path: Path, n: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_cat: dict[str, list[str]] = {}
    for r in rows:  # Spec-Bench rows: first turn of each; round-robin over the categories
        text = r["turns"][0] if "turns" in r else r["prompt"]
        by_cat.setdefault(r.get("category", ""), []).append(text)
    out, i = [], 0
    while len(out) < n:
        for texts in by_cat.values():
            if i < len(texts) and len(out) < n:
                out.append(texts[i])
        i += 1
    return out


async def ask(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, drop: bool) -> tuple[str, str | None]:
    """(outcome, text): outcome is the HTTP status, or 'dropped' for a client that disconnected."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": drop}
    if not drop:
        r = await client.post("/v1/chat/completions", json=body)
        if r.status_code != 200:
            return str(r.status_code), None
        return "200", r.json()["choices"][0]["message"]["content"]
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return str(r.status_code), None
        chunks = 0
        async for line in r.aiter_lines():
            chunks += line.startswith("data:")
            if chunks >= 3:
                break  # leaving the context closes the connection mid-stream
    return "dropped", None


async def aborts(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    m = re.search(r"^specdecode[:_]\w*abort\w*(?:_total)?\s+([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


async def main(a) -> dict:
    prompts = load_prompts(Path(a.prompts), a.prompts_n)
    async with httpx.AsyncClient(base_url=a.url, timeout=None,
                                 headers={"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        solo = [(await ask(client, model, p, a.max_tokens, False))[1] for p in prompts]
        before = await aborts(client)
        sem = asyncio.Semaphore(a.concurrency)

        async def one(i: int):
            async with sem:
                try:
                    return await ask(client, model, prompts[i % len(prompts)], a.max_tokens, i % a.drop_every == a.drop_every - 1)
                except httpx.HTTPError as e:
                    return f"error:{type(e).__name__}", None

        results = await asyncio.gather(*(one(i) for i in range(a.requests)))
        await asyncio.sleep(1.0)  # let the server notice the last disconnects
        after = await aborts(client)
    status = Counter(s for s, _ in results)
    done = [(i, t) for i, (s, t) in enumerate(results) if s == "200"]
    same = sum(t == solo[i % len(prompts)] for i, t in done)
    return {"requests": a.requests, "concurrency": a.concurrency, "status": dict(status),
            "lost": sum(1 for s, _ in results if s.startswith("error")),
            "5xx": sum(v for k, v in status.items() if k.startswith("5")),
            "completed": len(done), "identical_to_solo": same, "aborts_counted": after - before}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key")
    p.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL: Spec-Bench rows or {'prompt': ...}")
    p.add_argument("--prompts-n", type=int, default=8, help="distinct prompts")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--drop-every", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    print(json.dumps(asyncio.run(main(p.parse_args()))))
