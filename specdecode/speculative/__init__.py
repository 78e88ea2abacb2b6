"""Speculative decoding: proposers (one file each), draft trees, the acceptance rule, metrics and the
draft-length controller. ``make_proposer`` maps --spec-type to a proposer: one drafter, a chain of
them (chain.py: the controller picks per step and per sequence) or ``auto``. To add a drafter, write
``speculative/<name>.py`` (a Proposer subclass, see proposer.py for the contract), add its name to
config.DRAFTERS and its constructor to PROPOSERS below."""
from __future__ import annotations

from dataclasses import replace

from ..config import SpecConfig, spec_members
from ..runtime.target import Target
from .proposer import Proposer


def _ngram(spec, target, draft):
    from .ngram import NgramProposer

    return NgramProposer(spec)


def _ngram_mod(spec, target, draft):
    from .ngram_mod import NgramModProposer

    return NgramModProposer(spec)


def _suffix(spec, target, draft):
    from .suffix import SuffixProposer

    return SuffixProposer(spec)


def _draft_model(spec, target, draft):  # ``draft``: an already loaded (model, tokenizer) (tests)
    from .draft_model import DraftModelProposer

    return DraftModelProposer(spec, target, *(draft or (None, None)))


def _eagle(spec, target, draft):  # ``draft``: a built EagleHead (tests), else --spec-head / bundled
    from .eagle import EagleProposer

    return EagleProposer(spec, target, draft)


def _mtp(spec, target, draft):  # MTP heads read from the model file itself (``draft``: a loaded MTPHead)
    from .mtp import MTPProposer

    return MTPProposer(spec, target, draft)


# drafter name -> constructor(spec, target, draft); imported lazily so that unused drafters cost nothing.
PROPOSERS = {"ngram": _ngram, "ngram-simple": _ngram, "ngram-mod": _ngram_mod, "suffix": _suffix,
             "draft": _draft_model, "eagle3": _eagle, "eagle": _eagle, "draft-mtp": _mtp}
USES_DRAFT = ("draft", "eagle3", "eagle", "draft-mtp")  # members that take the ``draft`` argument


def auto_members(spec: SpecConfig, target: Target) -> tuple[str, ...]:
    """What ``auto`` chains for this model: the draftless drafters always (suffix where its package is
    installed, else prompt lookup; ngram-mod), a head when one exists (--spec-head, a bundled EAGLE-3
    head, MTP heads in the model file), a draft model only when the user names one."""
    from ..heads import find_head, head_fits
    from .suffix import available

    members = ["suffix" if available() else "ngram", "ngram-mod"]
    if spec.head:
        members.append("eagle3")
    else:
        try:
            if head_fits(find_head(target.name, "eagle3"), target.model.cfg):
                members.append("eagle3")
        except Exception:  # no bundled head for this model
            pass
    if getattr(target.model.cfg, "num_nextn_layers", 0):
        members.append("draft-mtp")
    if spec.model_draft:
        members.append("draft")
    return tuple(members)


def make_proposer(spec: SpecConfig, target: Target, draft=None) -> Proposer:
    """``draft``: a ready drafter model or head for the proposer (tests), else it loads its own."""
    if spec.spec_type == "none":
        return Proposer()
    members = spec_members(spec.spec_type) or auto_members(spec, target)
    built = [PROPOSERS[m](replace(spec, spec_type=m), target, draft if m in USES_DRAFT else None) for m in members]
    if len(built) == 1:
        return built[0]
    from .chain import ChainProposer

    return ChainProposer(built, spec.spec_merge)
