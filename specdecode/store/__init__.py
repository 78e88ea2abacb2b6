"""Model store: turn a user's model spec (a path or a known name) into a local path, pulling on demand.

`specdecode pull NAME` -> pull(); `specdecode models` -> list_models(); every command that takes a
model -> resolve_model().
"""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFileError
from .pull import (PIP_ARGS_ENV, HOME_ENV, PullError, cache_dir, file_identity, is_cached, model_path, pull,
                   replacing)
from .registry import REGISTRY, ModelEntry, Part, UnknownModelError, find_entry, get_entry, known_names

__all__ = [
    "HOME_ENV", "PIP_ARGS_ENV", "REGISTRY", "ModelEntry", "Part", "PullError", "UnknownModelError",
    "cache_dir", "file_identity", "find_entry", "get_entry", "is_cached", "known_names", "list_models", "model_path",
    "pull", "replacing", "resolve_model",
]

_PATHLIKE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json")


def resolve_model(spec: str, auto_pull: bool = True, *, quiet: bool = False) -> Path:
    """An existing file/directory wins (so a local dir named like a model is used as is); then a
    registry name -> its cached GGUF, pulled on first use unless auto_pull is False."""
    path = Path(spec).expanduser()
    if path.exists():
        return path
    entry = find_entry(spec)
    if entry is not None:
        if is_cached(entry):
            return model_path(entry)
        if not auto_pull:
            raise PullError(f"model {entry.name!r} is not downloaded yet; run: specdecode pull {entry.name}")
        return pull(entry, quiet=quiet)
    if _looks_like_path(spec):
        raise ModelFileError(f"model {spec!r}: no such file or directory")
    raise UnknownModelError(f"unknown model {spec!r}: not a file, directory or known name "
                            f"(known: {', '.join(known_names())})")


def list_models() -> list[dict]:
    """One row per known model, for `specdecode models`; `cached` costs a stat, never a hash."""
    return [{"name": e.name, "size": e.size, "cached": is_cached(e), "path": str(model_path(e)),
             "description": e.description} for e in (REGISTRY[n] for n in known_names())]


def _looks_like_path(spec: str) -> bool:
    seps = {"/", os.sep, os.altsep} - {None}
    return (any(s in spec for s in seps) or spec.startswith(("~", "."))
            or spec.lower().endswith(_PATHLIKE_SUFFIXES))
