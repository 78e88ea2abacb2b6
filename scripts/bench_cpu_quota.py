"""Plain decoding under a CPU quota (as `docker --cpus` sets one), per thread setting: the engine's own
default (runtime/cpus.py: at most the quota rounded up) against fixed counts. Each run is a fresh process
moved into a cgroup of its own with the quota (cgroup v1's cpu controller or v2's cpu.max; needs root),
which times a 48-token greedy answer after a warm-up; settings and quotas run in turns over --rounds.

    sudo python scripts/bench_cpu_quota.py --quotas 1.0,1.5 --threads default,1,2 --rounds 2
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

V1, V2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
PERIOD = 100_000


def make_group(name: str) -> Path:
    if (V1 / "cpu.cfs_quota_us").exists():
        g = V1 / name
    elif (V2 / "cgroup.controllers").exists():
        (V2 / "cgroup.subtree_control").write_text("+cpu")
        g = V2 / name
    else:
        sys.exit("no cgroup cpu controller found")
    g.mkdir(exist_ok=True)
    return g


def set_quota(g: Path, cpus: float) -> None:
    if (g / "cpu.cfs_quota_us").exists():
        (g / "cpu.cfs_quota_us").write_text(str(int(cpus * PERIOD)))
    else:
        (g / "cpu.max").write_text(f"{int(cpus * PERIOD)} {PERIOD}")


def child(model: str, threads: str) -> None:
    """Runs in the cgroup: one greedy answer, timed."""
    import torch

    from specdecode import LLM, SamplingParams
    llm = LLM(model, spec_type="none", threads=None if threads == "default" else int(threads))
    ids = llm.encode_chat([{"role": "user", "content": "Write a Python function that merges two sorted lists."}])
    llm.generate(ids, SamplingParams(temperature=0, max_tokens=4))  # warm-up
    t0 = time.perf_counter()
    llm.generate(ids, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    print(f"{torch.get_num_threads()} {48 / (time.perf_counter() - t0):.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--quotas", default="1.0,1.5", help="comma-separated CPUs per period")
    ap.add_argument("--threads", default="default,1,2", help="comma-separated: default (the engine's) or a count")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.model, a.child)
        return 0
    g = make_group("specdecode-bench")
    for r in range(a.rounds):
        for q in (float(x) for x in a.quotas.split(",")):
            set_quota(g, q)
            for t in a.threads.split(","):
                cmd = f"echo $$ > {g / 'cgroup.procs'} && exec {sys.executable} {Path(__file__).resolve()} " \
                      f"--model {a.model} --child {t}"
                out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=os.environ)
                n, tok_s = out.stdout.split()[-2:] if out.returncode == 0 else ("?", "failed: " + out.stderr[-200:])
                print(f"round {r + 1}, quota {q} CPUs, threads {t} ({n}): {tok_s} tok/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
