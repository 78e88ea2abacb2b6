"""`specdecode generate` end to end, as a user runs it: a fresh process per run (import, model load,
calibration, prefill, decode, exit), configurations in turns (order rotating) so that the host's drift
hits each alike. A configuration is a spec type, optionally run from another source tree
(``auto@/tmp/wt_base``: that checkout's specdecode, for before / after), optionally with cold caches
(``--cold``: each run gets a fresh SPECDECODE_HOME holding only a link to the models, so the converted
weights and the cost curve are made again, as on a first run).

    python scripts/bench_startup.py --configs none,auto,none@/tmp/wt_base,auto@/tmp/wt_base --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "Write a Python function that checks whether a number is prime."


def run_once(spec: str, tree: str | None, args, cold: bool) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = tree
    home = None
    if cold:
        from specdecode.store import cache_dir

        home = tempfile.TemporaryDirectory()
        os.symlink(cache_dir() / "models", Path(home.name) / "models")
        env["SPECDECODE_HOME"] = home.name
    cmd = [sys.executable, "-m", "specdecode.cli", "generate", "--chat", args.prompt, "--max-tokens",
           str(args.max_tokens), "--temperature", "0", "--spec-type", spec, "--json"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    if home is not None:
        home.cleanup()
    if out.returncode != 0:
        raise SystemExit(f"{spec}@{tree}: {out.stderr.strip().splitlines()[-1]}")
    o = json.loads(out.stdout)
    return {"wall_s": wall, "ttft_s": o["stats"]["time_to_first_token_s"],
            "decode_tok_s": o["stats"]["decode_tokens_per_s"], "tokens": o["token_ids"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="none,auto", help="spec[@tree], comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--cold", action="store_true", help="fresh caches (converted weights, cost curve) per run")
    args = ap.parse_args()
    configs = [(c.split("@")[0], c.split("@")[1] if "@" in c else None) for c in args.configs.split(",")]
    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for spec, tree in order:
            label = spec + (f"@{tree}" if tree else "")
            res = run_once(spec, tree, args, args.cold)
            runs.setdefault(label, []).append(res)
            print(f"round {r} {label}: wall {res['wall_s']:.2f} s, ttft {res['ttft_s']:.3f} s, "
                  f"decode {res['decode_tok_s']:.1f} tok/s", flush=True)
    first = next(iter(runs.values()))[0]["tokens"]
    same = all(x["tokens"] == first for v in runs.values() for x in v)
    print(f"\n| configuration | wall s, median (min-max) | time to first token s | decode tok/s |")
    print("|---|---:|---:|---:|")
    for label, v in runs.items():
        w = [x["wall_s"] for x in v]
        print(f"| {label} | {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | "
              f"{statistics.median(x['ttft_s'] for x in v):.3f} | {statistics.median(x['decode_tok_s'] for x in v):.1f} |")
    print(f"\nsame tokens in every run: {same}")


if __name__ == "__main__":
    main()
