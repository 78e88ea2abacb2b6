"""Speculative decoding: proposers (one file each), draft trees, the acceptance rule, metrics and the
draft-length controller. ``make_proposer`` maps --spec-type to a proposer."""
from __future__ import annotations

from ..config import SpecConfig
from ..errors import InvalidRequestError
from .proposer import Proposer


def make_proposer(spec: SpecConfig, engine, draft=None) -> Proposer:
    """``draft``: an already loaded (model, tokenizer) for --spec-type draft (tests), else loaded here."""
    if spec.spec_type == "none":
        return Proposer()
    if spec.spec_type in ("ngram", "ngram-simple"):
        from .ngram import NgramProposer

        return NgramProposer(spec)
    if spec.spec_type == "draft":
        from .draft_model import DraftModelProposer

        return DraftModelProposer(spec, engine, *(draft or (None, None)))
    raise InvalidRequestError(f"--spec-type {spec.spec_type} is not available yet")
