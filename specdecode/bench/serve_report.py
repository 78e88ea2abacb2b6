"""``bench-serve``'s figures: one concurrency level's summary of its requests, several rounds combined
(medians and paired ratios), the table and the plot."""
from __future__ import annotations


def _pct(xs: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(xs, q)) if xs else 0.0


def summarize_level(records: list[dict], wall: float) -> dict:
    out_tok = sum(r["completion_tokens"] for r in records)
    itl = [x for r in records for x in r["itl_s"]]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["completion_tokens"] - 1) for r in records if r["completion_tokens"] > 1]
    steps = sum(r["spec"].get("steps", 0) for r in records)
    acc = sum(r["spec"].get("accepted_tokens", 0) for r in records)
    drafted = sum(r["spec"].get("draft_tokens", 0) for r in records)
    ttft = [r["ttft_s"] for r in records]

    def ms(xs, q):
        return round(1000 * _pct(xs, q), 2)

    return {"requests": len(records), "duration_s": round(wall, 3),
            "request_throughput": round(len(records) / wall, 3), "output_tokens_per_s": round(out_tok / wall, 2),
            "ttft_p50_ms": ms(ttft, 50), "ttft_p99_ms": ms(ttft, 99), "itl_p50_ms": ms(itl, 50),
            "itl_p99_ms": ms(itl, 99), "itl_max_ms": ms(itl, 100), "tpot_p50_ms": ms(tpot, 50),
            "tpot_p99_ms": ms(tpot, 99),
            "tau": round(1 + acc / steps, 3) if steps else 1.0,
            "acceptance_rate": round(acc / drafted, 3) if drafted else 0.0}


def add_round(runs: dict[int, list[dict]], summary: dict[int, dict], recs: list[dict], label: str, r: int,
               rounds: int) -> list[dict]:
    """Appends round r's level summaries to ``runs`` (level -> summaries in round order) and returns
    its per-request records labelled with the configuration (and the round, when there are several)."""
    for c, s in summary.items():
        runs.setdefault(c, []).append(s)
    return [{"config": label, **({"round": r + 1} if rounds > 1 else {}), **x} for x in recs]


def combine_rounds(runs: dict[str, dict[int, list[dict]]]) -> dict[str, dict[int, dict]]:
    """label -> level -> the summaries of its rounds, in round order -> label -> level -> one summary:
    the only round's as it is; with several, each figure's median, the tok/s of every round
    (``output_tokens_per_s_runs``) and, for every configuration, the median and range of its tok/s over
    the first configuration's in the same round (``vs_first``, ``vs_first_range``), and of its tok/s over
    its own at its lowest level in the same round (``scaling``, ``scaling_range``: the levels of one round
    run back to back): paired ratios, which a machine's drift between rounds does not reach."""
    import statistics

    first = next(iter(runs.values()), {})
    out: dict[str, dict[int, dict]] = {}
    for label, by_c in runs.items():
        out[label] = {}
        for c, ss in by_c.items():
            if len(ss) == 1:
                out[label][c] = ss[0]
                continue
            m = {k: round(statistics.median(s[k] for s in ss), 3) for k in ss[0]}
            m["rounds"] = len(ss)
            m["output_tokens_per_s_runs"] = [s["output_tokens_per_s"] for s in ss]
            ref = first.get(c, [])
            ratios = [s["output_tokens_per_s"] / b["output_tokens_per_s"]
                      for s, b in zip(ss, ref) if b["output_tokens_per_s"]]
            if ratios:
                m["vs_first"] = round(statistics.median(ratios), 3)
                m["vs_first_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
            lowest = by_c[min(by_c)]
            scaling = [s["output_tokens_per_s"] / b["output_tokens_per_s"]
                       for s, b in zip(ss, lowest) if b["output_tokens_per_s"]]
            if scaling:
                m["scaling"] = round(statistics.median(scaling), 3)
                m["scaling_range"] = [round(min(scaling), 3), round(max(scaling), 3)]
            out[label][c] = m
    return out


def _ratio(f: dict, key: str, value: float | None) -> str:
    """A ratio column: the rounds' median (range) where ``f`` combines several, else ``value``."""
    if key in f:
        lo, hi = f[key + "_range"]
        return f"{f[key]:.2f}x ({lo:.2f}-{hi:.2f})"
    return f"{value:.2f}x" if value else "-"


def format_table(results: dict) -> str:
    base = next(iter(results.values()))
    lines = [f"{'config':20s} {'conc':>4s} {'req/s':>7s} {'tok/s':>8s} {'ttft50':>8s} {'ttft99':>8s} "
             f"{'itl50':>7s} {'itl99':>7s} {'itlmax':>7s} {'tpot50':>7s} {'tau':>5s} {'vs first':>8s} {'scaling':>8s}"]
    for label, by_c in results.items():
        lowest = by_c[min(by_c)]["output_tokens_per_s"] if by_c else None
        for c, f in by_c.items():
            ref = base.get(c, {}).get("output_tokens_per_s")
            rel = _ratio(f, "vs_first", ref and f["output_tokens_per_s"] / ref)
            scale = _ratio(f, "scaling", lowest and f["output_tokens_per_s"] / lowest)
            tps = f"{f['output_tokens_per_s']:8.1f}"
            if "output_tokens_per_s_runs" in f:
                tps += f" ({min(f['output_tokens_per_s_runs']):.1f}-{max(f['output_tokens_per_s_runs']):.1f})"
            lines.append(f"{label:20s} {c:4d} {f['request_throughput']:7.2f} {tps} "
                         f"{f['ttft_p50_ms']:8.1f} {f['ttft_p99_ms']:8.1f} {f['itl_p50_ms']:7.1f} "
                         f"{f['itl_p99_ms']:7.1f} {f.get('itl_max_ms', float('nan')):7.1f} {f['tpot_p50_ms']:7.1f} "
                         f"{f['tau']:5.2f} {rel:>8s} {scale:>8s}")
    note = ("\n(latencies in ms; 'vs first': output tok/s against the first configuration; 'scaling': against the "
            "same configuration's at its lowest concurrency")
    if any("rounds" in f for by_c in results.values() for f in by_c.values()):
        note += "; several rounds: medians, tok/s's range, and the ratios' median (range) over the rounds' own"
    return "\n".join(lines) + note + ")"


def plot(path: str, results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (label, by_c) in enumerate(results.items()):
        cs, color = list(by_c), f"C{i}"
        ax1.plot(cs, [by_c[c]["output_tokens_per_s"] for c in cs], marker="o", color=color, label=label)
        ax2.plot(cs, [by_c[c]["tpot_p50_ms"] for c in cs], marker="o", color=color, label=f"{label} TPOT p50")
        ax2.plot(cs, [by_c[c]["ttft_p50_ms"] for c in cs], marker="x", ls="--", color=color,
                 label=f"{label} TTFT p50")
    levels = sorted({c for by_c in results.values() for c in by_c})
    for ax, ylabel in ((ax1, "output tokens/s (all requests)"), (ax2, "latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
