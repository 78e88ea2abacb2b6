"""Prompt sets for ``specdecode bench``: JSONL with Spec-Bench's format
({"question_id", "category", "turns": [user turn, ...]}) or {"prompt": ...} (one turn). MT-bench's
questions have two turns; ``bench`` runs them as Spec-Bench does (bench/run.py)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecDecodeError

# Spec-Bench as the workspace lays it out, beside the checkout: found from the checkout's root or
# from wherever the command runs (a relative path is tried as given first).
DEFAULT_PROMPTS = "../shared/datasets/spec_bench/question.jsonl"
_CHECKOUT = Path(__file__).resolve().parents[2]
# Spec-Bench's "multi-turn conversation" category is MT-bench's 80 questions in 8 sub-categories.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    turns: tuple[str, ...]  # the user's turns, in order (at least one)

    @property
    def text(self) -> str:
        """The first user turn (what a single-turn caller sends)."""
        return self.turns[0]


def load_prompts(path: str | Path, categories: list[str] | None = None, limit: int | None = None) -> list[Prompt]:
    """Prompts in file order; ``categories`` filters (``mt_bench`` selects MT-bench's eight);
    ``limit`` keeps the first N of each category."""
    path = Path(path)
    if not path.is_file() and not path.is_absolute() and (_CHECKOUT / path).is_file():
        path = _CHECKOUT / path
    if not path.is_file():
        raise SpecDecodeError(f"prompt file {path} not found (pass --prompts FILE)")
    wanted = None
    if categories:
        wanted = set()
        for c in categories:
            wanted |= set(MT_BENCH) if c == "mt_bench" else {c}
    out, seen = [], {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = tuple(row["turns"]) if "turns" in row else (row["prompt"],)
            if not turns or not all(isinstance(t, str) for t in turns):
                raise TypeError
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecDecodeError(f"{path}:{n}: expected a JSON object with 'turns' or 'prompt'") from None
        cat = row.get("category", "default")
        if wanted is not None and cat not in wanted:
            continue
        if limit is not None and seen.get(cat, 0) >= limit:
            continue
        seen[cat] = seen.get(cat, 0) + 1
        out.append(Prompt(str(row.get("question_id", n)), cat, turns))
    if not out:
        raise SpecDecodeError(f"no prompts selected from {path} (categories: {categories})")
    return out


def parse_turns(text: str) -> int | None:
    """--turns: 'all' -> None, else a positive count."""
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected 'all' or a positive number of turns, got {text!r}")
    return int(text)
