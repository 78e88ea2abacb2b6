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
    if spec.spec_type in ("eagle3", "eagle"):  # ``draft``: a built EagleHead (tests), else --spec-head / bundled
        from .eagle import EagleProposer

        return EagleProposer(spec, engine, draft)
    if spec.spec_type == "draft-mtp":  # MTP heads read from the model file itself (``draft``: a loaded MTPHead)
        from .mtp import MTPProposer

        return MTPProposer(spec, engine, draft)
    raise InvalidRequestError(f"--spec-type {spec.spec_type} is not available yet")
