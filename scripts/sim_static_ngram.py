"""Would a static n-gram table from a code corpus (llama.cpp's ``--lookup-cache-static``, REST's datastore)
help the draftless drafters? A replay, no engine: the Python standard library's source (tests left out)
tokenized with the target's tokenizer gives, for n = 5, 4, 3, the most frequent next token after each
n-gram (seen at least twice). The greedy outputs of a `specdecode bench` JSON (its `none` records) are
then replayed step by step with drafts of up to 6 tokens from: a dynamic 3-gram table over the output so
far and earlier outputs (a stand-in for ngram-mod; the prompt is not in the JSON), the static table alone,
and the static table where the dynamic one finds nothing. Prints tau (tokens per step) per category.

    python scripts/sim_static_ngram.py out/r22_specbench5.json
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MULT, MASK = 1000003, (1 << 64) - 1
K = 6  # draft tokens per step


def corpus(tokenizer) -> np.ndarray:
    root = sysconfig.get_paths()["stdlib"]
    ids = []
    for f in sorted(glob.glob(root + "/**/*.py", recursive=True)):
        if "site-packages" in f or "/test/" in f or "/tests/" in f:
            continue
        try:
            ids += tokenizer.encode(open(f, encoding="utf-8").read(), add_special_tokens=False) + [-1]
        except (UnicodeDecodeError, OSError):
            continue
    return np.array(ids, dtype=np.int64)


def key(window) -> int:
    h = 0
    for t in window:
        h = (h * MULT + t) & MASK
    return h


def table(arr: np.ndarray, n: int, min_count: int = 2) -> dict[int, int]:
    """hash(n tokens) -> the most frequent next token (ties: the smallest id), windows crossing a file
    boundary (-1) left out."""
    L = len(arr) - n
    h = np.zeros(L, dtype=np.uint64)
    ok = arr[n:] >= 0
    for i in range(n):
        h = h * np.uint64(MULT) + arr[i:i + L].astype(np.uint64)  # wraps mod 2^64, as key()
        ok &= arr[i:i + L] >= 0
    pairs = collections.Counter(zip(h[ok].tolist(), arr[n:][ok].tolist()))
    best: dict[int, tuple[int, int]] = {}
    for (k, t), c in pairs.items():
        if c >= min_count and (k not in best or (c, -t) > (best[k][1], -best[k][0])):
            best[k] = (t, c)
    return {k: t for k, (t, _) in best.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    a = ap.parse_args()
    from specdecode.store import resolve_model
    from specdecode.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(resolve_model(a.model, auto_pull=False))
    arr = corpus(tok)
    static = {n: table(arr, n) for n in (5, 4, 3)}
    print(f"corpus: {len(arr)} tokens; table sizes {({n: len(t) for n, t in static.items()})}")

    def from_static(ctx):
        d, c = [], list(ctx[-5:])
        while len(d) < K:
            nxt = next((static[n].get(key(c[-n:])) for n in static if len(c) >= n and key(c[-n:]) in static[n]), None)
            if nxt is None:
                break
            d.append(nxt)
            c.append(nxt)
        return d

    def from_dynamic(ctx, dyn):
        d, c = [], list(ctx[-3:])
        while len(d) < K and len(c) >= 3 and tuple(c[-3:]) in dyn:
            d.append(dyn[tuple(c[-3:])])
            c.append(d[-1])
        return d

    records = [r for r in json.load(open(a.bench_json))["records"] if r["config"] == "none"]
    steps, tokens = collections.Counter(), collections.Counter()
    pool: dict[tuple, int] = {}  # earlier outputs' 3-grams
    for r in records:
        out = r["token_ids"]
        for mode in ("dynamic", "static", "both"):
            dyn, pos = dict(pool), 0
            while pos < len(out):
                if pos >= 4:
                    dyn[tuple(out[pos - 4:pos - 1])] = out[pos - 1]
                d = from_dynamic(out[:pos], dyn) if mode != "static" else []
                if mode == "static" or (mode == "both" and not d):
                    d = from_static(out[:pos])
                acc = 0
                while acc < len(d) and pos + acc < len(out) and d[acc] == out[pos + acc]:
                    acc += 1
                pos += acc + 1
                steps[(r["category"], mode)] += 1
            tokens[(r["category"], mode)] += len(out)
        pool.update({tuple(out[i - 3:i]): out[i] for i in range(3, len(out))})
    for cat in sorted({c for c, _ in steps}):
        print(f"{cat:16s} " + "  ".join(f"{m} tau {tokens[(cat, m)] / steps[(cat, m)]:.2f}"
                                        for m in ("dynamic", "static", "both")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
