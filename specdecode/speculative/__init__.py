"""Speculative decoding: proposers (one file each), draft trees, the acceptance rule, metrics and the
draft-length controller. ``make_proposer`` maps --spec-type to a proposer: to add one, write
``speculative/<name>.py`` (a Proposer subclass, see proposer.py for the contract), add its
--spec-type name to config.SPEC_TYPES and its constructor to PROPOSERS below."""
from __future__ import annotations

from ..config import SpecConfig
from ..runtime.target import Target
from .proposer import Proposer


def _ngram(spec, target, draft):
    from .ngram import NgramProposer

    return NgramProposer(spec)


def _draft_model(spec, target, draft):  # ``draft``: an already loaded (model, tokenizer) (tests)
    from .draft_model import DraftModelProposer

    return DraftModelProposer(spec, target, *(draft or (None, None)))


def _eagle(spec, target, draft):  # ``draft``: a built EagleHead (tests), else --spec-head / bundled
    from .eagle import EagleProposer

    return EagleProposer(spec, target, draft)


def _mtp(spec, target, draft):  # MTP heads read from the model file itself (``draft``: a loaded MTPHead)
    from .mtp import MTPProposer

    return MTPProposer(spec, target, draft)


# --spec-type -> constructor(spec, target, draft); imported lazily so that unused drafters cost nothing.
PROPOSERS = {"none": lambda spec, target, draft: Proposer(), "ngram": _ngram, "ngram-simple": _ngram,
             "draft": _draft_model, "eagle3": _eagle, "eagle": _eagle, "draft-mtp": _mtp}


def make_proposer(spec: SpecConfig, target: Target, draft=None) -> Proposer:
    """``draft``: a ready drafter model or head for the proposer (tests), else it loads its own."""
    return PROPOSERS[spec.spec_type](spec, target, draft)
