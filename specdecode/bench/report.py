"""Summaries of bench records: a table per category (decode tok/s, τ, acceptance, speed-up against
`none` in the same run), the raw JSON, and a matplotlib chart."""
from __future__ import annotations

import json
from collections import defaultdict

from .prompts import MT_BENCH


def _group(cat: str) -> str:
    return "mt_bench" if cat in MT_BENCH else cat


def summarize(records: list[dict]) -> dict[str, dict[str, dict]]:
    """{category: {config: figures}} with categories as in the file, Spec-Bench groups, and 'all'.
    "prompts" counts records: one per turn (an MT-bench question run with both turns counts twice)."""
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    for r in records:
        cats = {r["category"], _group(r["category"]), "all"}
        for c in cats:
            a = acc[c][r["config"]]
            a["prompts"] += 1
            a["tokens"] += max(r["completion_tokens"] - 1, 0)
            a["decode_s"] += r["decode_s"]
            a["steps"] += r["spec"]["steps"]
            a["drafted"] += r["spec"]["draft_tokens"]
            a["accepted"] += r["spec"]["accepted_tokens"]
            a["draft_s"] += r["spec"]["draft_time_s"]
            a["verify_s"] += r["spec"]["verify_time_s"]
    out: dict = {}
    for c, by_cfg in acc.items():
        base = by_cfg.get("none")
        base_tps = base["tokens"] / base["decode_s"] if base and base["decode_s"] else None
        out[c] = {}
        for cfg, a in by_cfg.items():
            tps = a["tokens"] / a["decode_s"] if a["decode_s"] else 0.0
            out[c][cfg] = {
                "prompts": int(a["prompts"]), "decode_tokens_per_s": round(tps, 3),
                "tau": round(1 + a["accepted"] / a["steps"], 3) if a["steps"] else 1.0,
                "acceptance_rate": round(a["accepted"] / a["drafted"], 3) if a["drafted"] else 0.0,
                "speedup": round(tps / base_tps, 3) if base_tps else None,
                "draft_share": round(a["draft_s"] / a["decode_s"], 3) if a["decode_s"] else 0.0,
                "verify_share": round(a["verify_s"] / a["decode_s"], 3) if a["decode_s"] else 0.0,
            }
    return out


def format_table(summary: dict) -> str:
    order = sorted(summary, key=lambda c: (c == "all", c not in ("mt_bench", "translation", "summarization",
                                                                 "qa", "math_reasoning", "rag"), c))
    lines = [f"{'category':16s} {'config':22s} {'n':>4s} {'tok/s':>7s} {'tau':>5s} {'acc%':>5s} {'speedup':>8s} "
             f"{'draft%':>6s} {'verify%':>7s}"]
    for c in order:
        for cfg, f in summary[c].items():
            sp = f"{f['speedup']:.2f}x" if f["speedup"] is not None else "-"
            lines.append(f"{c:16s} {cfg:22s} {f['prompts']:4d} {f['decode_tokens_per_s']:7.2f} {f['tau']:5.2f} "
                         f"{100 * f['acceptance_rate']:5.1f} {sp:>8s} {100 * f['draft_share']:6.1f} "
                         f"{100 * f['verify_share']:7.1f}")
    return "\n".join(lines)


def write_json(path: str, meta: dict, records: list[dict], summary: dict) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "summary": summary, "records": records}, f, indent=1)


def plot(path: str, records: list[dict], summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [c for c in summary if c != "all" and c in {r["category"] for r in records} | {"all"}] + ["all"]
    cfgs = [c for c in summary["all"] if c != "none"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    w = 0.8 / max(len(cfgs), 1)
    for i, cfg in enumerate(cfgs):
        ys = [summary[c].get(cfg, {}).get("speedup") or 0 for c in cats]
        ax1.bar([j + i * w for j in range(len(cats))], ys, w, label=cfg)
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xticks([j + w * (len(cfgs) - 1) / 2 for j in range(len(cats))], cats, rotation=30, ha="right")
    ax1.set_ylabel("decode speed-up vs none")
    ax1.legend()
    for cfg in cfgs:  # acceptance length per step = accepted tokens + 1, from per-position counts
        hist = defaultdict(int)
        for r in (r for r in records if r["config"] == cfg):
            per = r["spec"]["accepted_per_position"] + [0]
            steps = r["spec"]["steps"]
            for k in range(len(per)):  # steps accepting exactly k = (accepting >= k) - (accepting >= k+1)
                hist[k + 1] += (per[k - 1] if k else steps) - per[k]
        ks = sorted(hist)
        ax2.plot(ks, [hist[k] for k in ks], marker="o", label=cfg)
    ax2.set_xlabel("tokens per step (accepted + 1)")
    ax2.set_ylabel("steps")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
