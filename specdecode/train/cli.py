"""``specdecode train-head --model M --kind eagle3|eagle|mtp --data FILES... --out DIR``.

EAGLE heads: (1) token windows from the corpus (+ optional self-distillation), split by file into
train / held-out; (2) the frozen target's features over them, cached in DIR/features in shards;
(3) training (train/eagle.py), checkpointed in DIR/checkpoint.pt; (4) the head written to DIR in the
HF or speculators layout. Every stage resumes: rerunning the same command continues where a
``--time-limit`` or an interruption stopped it. ``--kind mtp`` is handed to train/mtp.py."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ..args import add_model_args

# EAGLE defaults; flags left unset reach --kind mtp as None, so that train/mtp.py applies its own.
EAGLE_DEFAULTS = dict(seq_len=512, corpus_tokens=100_000, distill=0, general=0, distill_tokens=256, eval_frac=0.05,
                      draft_vocab=8192, head_intermediate=0, ttt_steps=3, steps=1000, batch_size=4, lr=1e-3, eval_every=100,
                      save_every=100)
_FEATURE_KEYS = ("seq_len", "corpus_tokens", "distill", "general", "distill_tokens", "eval_frac")  # decide the cached features


def add_train_parser(sub) -> None:
    t = sub.add_parser("train-head", help="train a draft head (EAGLE-3, EAGLE-1 or MTP) for a frozen target")
    add_model_args(t)
    t.add_argument("--kind", choices=("eagle3", "eagle", "mtp"), default="eagle3")
    t.add_argument("--data", nargs="+", default=["stdlib"],
                   help="corpus: 'stdlib' (Python's standard library source), files, directories or globs")
    t.add_argument("--out", required=True, help="output directory (features, checkpoint, the head)")
    d = EAGLE_DEFAULTS
    for flag, typ, text in (
            ("--seq-len", int, "tokens per training window"),
            ("--corpus-tokens", int, "corpus tokens to use"),
            ("--distill", int, "self-distillation: N chat prompts written from the corpus, answered by the target"),
            ("--general", int, "self-distillation: N general-domain chat prompts (not about Python)"),
            ("--distill-tokens", int, "answer length cap"),
            ("--eval-frac", float, "held-out share of files"),
            ("--draft-vocab", int, "EAGLE-3 draft vocabulary size"),
            ("--head-intermediate", int, "the head's MLP width (0: the target's)"),
            ("--ttt-steps", int, "training-time-test steps"),
            ("--steps", int, "optimizer steps"),
            ("--batch-size", int, "windows per step"),
            ("--lr", float, "peak learning rate"),
            ("--eval-every", int, "steps between held-out evaluations"),
            ("--save-every", int, "steps between checkpoints")):
        key = flag[2:].replace("-", "_")
        t.add_argument(flag, type=typ, default=None, help=f"{text} (EAGLE default {d[key]})")
    t.add_argument("--prompts", help="extra distillation prompts: JSONL {'prompt': ...} (never Spec-Bench)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--layout", choices=("hf", "speculators"), default="hf")
    t.add_argument("--store", choices=("bfloat16", "int8"), default="bfloat16",
                   help="weights as written: bfloat16, or int8 rows with a scale each (a quarter of the "
                        "float32 size; what the CPU runs anyway)")
    t.add_argument("--time-limit", type=float, default=0.0, help="minutes; stop cleanly (resumable) after it")
    t.set_defaults(func=cmd_train_head, quant="none")  # --quant int4: features and labels of the target as deployed


def eagle_args(a) -> argparse.Namespace:
    """The parsed arguments with EAGLE defaults for the hyperparameters left unset."""
    return argparse.Namespace(**{**vars(a), **{k: v for k, v in EAGLE_DEFAULTS.items() if getattr(a, k, None) is None}})


def cmd_train_head(a) -> int:
    if a.kind == "mtp":
        from .mtp import train_mtp_head

        return train_mtp_head(a)
    a = eagle_args(a)
    from ..runtime.device import resolve_device_dtype
    from ..loader import load_checkpoint, weight_quant
    from ..loader.eagle_ckpt import save_head
    from ..heads import model_key
    from ..store import resolve_model
    from .data import load_shards, resolve_data
    from .eagle import TrainConfig, Windows, draft_vocabulary, fit, new_head

    deadline = time.time() + 60 * a.time_limit if a.time_limit > 0 else None
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device, dtype = resolve_device_dtype(a.device, a.dtype)
    files = resolve_data(a.data)  # validate before the (slow) model load
    model, tok = load_checkpoint(resolve_model(a.model), dtype, device, weight_quant(a.quant, device), a.weight_cache)
    out = Path(a.out)
    layers = _aux_layers(model, a.kind)
    if not build_features(model, tok, files, out / "features", a, layers, deadline):
        print("features incomplete (time limit): rerun the same command to continue")
        return 0
    train, held = (Windows(load_shards(out / "features", s), a.kind == "eagle") for s in ("train", "eval"))
    print(f"features: {sum(train.lens)} training tokens in {len(train)} windows, {sum(held.lens)} held out")
    draft_ids = draft_vocabulary(train, a.draft_vocab, sorted(tok.eos_ids), model.cfg.vocab_size)
    head = new_head(model, a.kind, draft_ids, a.seed, verifier=model_key(a.model),
                    intermediate_size=a.head_intermediate).float()
    w_labels = model.head_rows(draft_ids if a.kind == "eagle3" else None)
    cov = float(torch.isin(train.column("argmax"), draft_ids).float().mean())
    print(f"draft vocabulary: {len(draft_ids)} tokens, covering {100 * cov:.1f}% of the target's training tokens")
    cfg = TrainConfig(kind=a.kind, draft_vocab=a.draft_vocab, ttt_steps=a.ttt_steps, steps=a.steps,
                      batch_size=a.batch_size, lr=a.lr, eval_every=a.eval_every, save_every=a.save_every, seed=a.seed)
    res = fit(head, w_labels, train, held, cfg, out, device, deadline)
    if not res["done"]:
        print(f"stopped at step {res['step']}/{cfg.steps} (time limit): rerun the same command to resume")
        return 0
    save_head(head, out, a.layout, dtype=torch.bfloat16, store="int8" if a.store == "int8" else "float")
    ev = res["eval"]
    if ev is not None:
        report = {"steps": res["step"], "train_tokens": sum(train.lens), "held_out_tokens": sum(held.lens),
                  "draft_vocab_coverage": round(cov, 4), "eval": ev}
        (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"held-out top-1 agreement per draft step: {' '.join(f'{x:.3f}' for x in ev['top1'])}")
    print(f"saved {a.kind} head to {out}")
    return 0


def _aux_layers(model, kind: str) -> tuple[int, ...]:
    from ..models.eagle import default_aux_layers

    return default_aux_layers(model.cfg.num_layers) if kind == "eagle3" else ()


# Prompts answered per batch: 32 rows per decode step let the int4 kernel's AMX passes (16 rows each)
# take the whole step where the CPU has AMX; on the CPU kernels a row's result does not depend on the
# others in its batch, so the answers are the same at any batch size.
DISTILL_BATCH = 32


def build_features(model, tok, files, fdir: Path, a, layers, deadline) -> bool:
    """Extracts (or resumes extracting) the target's features of the train and held-out windows;
    False if the deadline came first."""
    from .data import (answered, cached_windows, check_prompt_file, extract_shard, extract_unrecorded, is_heldout,
                       sample_windows, write_manifest)
    from .prompts import distill_prompts, general_prompts

    # "general" and "quant" enter the manifest only when used, so caches built before those flags
    # existed stay valid; "answers" where answers are distilled: a cache from before their shards were
    # apart holds them among the corpus windows' shards
    settings = {"model": str(a.model), "data": list(a.data), "layers": list(layers), "seed": a.seed,
                **{k: getattr(a, k) for k in _FEATURE_KEYS if k != "general" or a.general}, "prompts": a.prompts,
                **({"quant": a.quant} if a.quant != "none" else {}),
                **({"answers": "apart"} if a.distill or a.general or a.prompts else {})}
    write_manifest(fdir, settings)
    held = [f for f in files if is_heldout(f, a.eval_frac)] or files[-1:]
    held_set = set(held)
    train = [f for f in files if f not in held_set] or files
    extra = []
    if a.prompts:
        check_prompt_file(a.prompts)
        lines = Path(a.prompts).read_text().splitlines()
        extra = [json.loads(x)["prompt"] if x.lstrip().startswith("{") else x for x in lines if x.strip()]

    def n_eval(n: int) -> int:
        return max(1, round(n * a.eval_frac)) if n else 0

    general = general_prompts(a.general + n_eval(a.general), a.seed)  # distinct prompts: a split never shares one
    for split, fs, budget, n_distill, gen, seed in (
            ("train", train, a.corpus_tokens, a.distill, general[:a.general], a.seed),
            ("eval", held, max(2048, int(a.corpus_tokens * a.eval_frac)), n_eval(a.distill), general[a.general:],
             a.seed + 1)):
        windows = cached_windows(fdir / f"{split}_windows.json",
                                 lambda: sample_windows(tok, fs, a.seq_len, budget, seed))
        if n_distill or gen:
            prompts = distill_prompts(fs, n_distill, seed) + gen + (extra if split == "train" else [])
            shard = (lambda k, split=split: fdir / f"{split}_answers_{k:05d}.pt")  # batch k's windows
            got = answered(model, tok, prompts, a.distill_tokens, DISTILL_BATCH, fdir / f"distill_{split}.json",
                           deadline, (layers, a.seq_len, shard))
            if got is None:
                return False
            if not extract_unrecorded(model, got, DISTILL_BATCH, layers, a.seq_len, shard, deadline):
                return False
        for i in range(0, len(windows), 16):
            f = fdir / f"{split}_shard_{i // 16:05d}.pt"
            if f.exists():
                continue
            if deadline is not None and time.time() > deadline:
                return False
            torch.save(extract_shard(model, windows[i:i + 16], layers), f)
            print(f"features {split}: {min(i + 16, len(windows))}/{len(windows)} windows", flush=True)
    return True
