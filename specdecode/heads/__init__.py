"""Draft heads bundled with the package (package data, so an installed wheel has them too):
``<model>-<kind>/`` holds an EAGLE head (config.json + model.safetensors) for a known model; a
directory whose config.json names ``base_model`` holds MTP heads for that model. README.md here
says what each is and how scripts/build_heads.sh rebuilt it."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import InvalidRequestError

HEADS_DIR = Path(__file__).resolve().parent


def model_key(model: str) -> str:
    """The registry name of a known model (whatever path it was given by), else the file's or directory's name."""
    from ..store import find_entry

    entry = find_entry(model)
    if entry is not None:
        return entry.name
    p = Path(model)
    return (p.stem if p.suffix.lower() == ".gguf" else p.name).lower()


def find_head(model: str, kind: str) -> Path:
    """The bundled ``kind`` (eagle3 | eagle) head directory for ``model``; a clear error if there is none."""
    d = HEADS_DIR / f"{model_key(model)}-{kind}"
    if not d.is_dir():
        raise InvalidRequestError(f"no bundled {kind} head for {model_key(model)!r}: train one with "
                                  f"`specdecode train-head --kind {kind}` and pass --spec-head DIR")
    return d


def held_out_acceptance(path: Path) -> tuple[float, ...]:
    """A trained head's held-out top-1 agreement per draft step (``train_report.json``, written by
    train-head), the controller's prior for it; () when the directory has no readable report."""
    try:
        top1 = json.loads((Path(path) / "train_report.json").read_text())["eval"]["top1"]
        return tuple(min(1.0, max(0.0, float(x))) for x in top1)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return ()


def head_fits(path: Path, cfg) -> bool:
    """Whether the head in ``path`` reads a target shaped like ``cfg`` (vocabulary and hidden size):
    a model known by a bundled head's name may be another model (a test's, a renamed file)."""
    try:
        c = json.loads((path / "config.json").read_text())
        layer = c.get("transformer_layer_config") or c
        return layer["vocab_size"] == cfg.vocab_size and (c.get("target_hidden_size") or layer["hidden_size"]) == cfg.hidden_size
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False


def bundled_heads(model: str) -> list[Path]:
    """Bundled head directories whose config.json names ``model`` as its base_model (MTP heads)."""
    found = []
    for cfg in sorted(HEADS_DIR.glob("*/config.json")):
        try:
            base = json.loads(cfg.read_text()).get("base_model")
        except (OSError, json.JSONDecodeError):
            continue
        if base in (model, Path(model).stem):
            found.append(cfg.parent)
    return found
