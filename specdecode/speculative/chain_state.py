"""A chain's per-request state (speculative/chain.py) and the arithmetic of a merged draft's reach.

Merging (``--spec-merge``): where a model member is chosen and a draftless member also found a draft,
the two deterministic drafts can be verified as one tree (their trie union, DraftTree.union): the step
accepts the longer of the two matches. ``plan`` values the union from both records, taking their
matches as independent (position d is reached with probability P_a + P_b - P_a P_b, where P is a
member's probability of reaching d alone), at the drafting cost of the model member and the verify
cost of every node, over the leading j nodes of the draftless draft for each j; the union is drafted
when its best rate beats the model member's alone. Each member's record is then credited with its own
tree's match (DraftTree.match), so what the union accepts through one member never counts as the
other's. A sampled model draft (a draft model at T > 0) carries draft probabilities and is verified
alone: the p/q rule is not defined for a node with one sampled and one deterministic sibling here."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import zip_longest

from .controller import AcceptanceEstimate
from .tree import DraftTree


class MemberView:
    """A member's view of a sequence: the sequence itself, with the member's own ``draft_state``."""

    def __init__(self, seq, state: list, i: int):
        object.__setattr__(self, "_seq", seq)
        object.__setattr__(self, "_state", state)
        object.__setattr__(self, "_i", i)

    def __getattr__(self, name):
        return getattr(self._seq, name)

    @property
    def draft_state(self):
        return self._state[self._i]

    def __setattr__(self, name, value):  # (a property setter would never run: this comes first)
        if name == "draft_state":
            self._state[self._i] = value
        else:
            setattr(self._seq, name, value)


@dataclass
class ChainState:
    """One request's state in a chain: each member's own state and records, and what ``plan`` chose and
    found for it this step."""

    members: list  # each member's own draft_state
    acceptance: list[AcceptanceEstimate]  # each member's record for this request
    evidence: list[dict[int, AcceptanceEstimate]]  # each member's records per evidence class (DraftTree.evidence)
    cls: dict[int, int] = field(default_factory=dict)  # member -> the evidence class of its draft this step
    seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # member -> (positions seen, right) of those
    proposed: bool = False  # propose() built this step's draft (else none of ``ready`` was verified)
    choice: int | None = None  # the member drafting this step (None: plain decoding)
    ready: dict[int, DraftTree] = field(default_factory=dict)  # drafts the draftless members found this step
    # (draftless member, its leading nodes) whose draft joins the chosen model member's tree this step
    merged: tuple[int, int] | None = None
    room: int = 0  # the most nodes this step's draft may have (the room plan was given)
    own: DraftTree | None = None  # the chosen member's own draft, when merged
    matched: dict[int, int] = field(default_factory=dict)  # member -> its own draft's accepted tokens

    def record(self, i: int, pools: dict[int, AcceptanceEstimate], member) -> AcceptanceEstimate:
        """Member i's record that values (and then observes) its draft this step: the record of the draft's
        evidence class where it has one, whose prior is the class's engine-wide record ``pools[c]`` (made
        on the class's first draft in the engine, from the member's measured ``evidence_prior``), else
        the member's record."""
        c = self.cls.get(i, 0)
        if not c:
            return self.acceptance[i]
        rec = self.evidence[i].get(c)
        if rec is None:
            if c not in pools:
                pools[c] = AcceptanceEstimate(prior=member.evidence_prior(c))
            rec = self.evidence[i][c] = AcceptanceEstimate(pool=pools[c])
        return rec


def identity(k: int) -> int:
    """The depth of a chain of k tokens: the plain-decoding value's ``depth``."""
    return k


def union_reach(pa: list[float], pb: list[float]) -> list[float]:
    """Per position, the probability that a union reaches it when either of two independent drafts
    does (pa, pb: each draft's own; a shorter list reaches no further)."""
    return [a + b - a * b for a, b in zip_longest(pa, pb, fillvalue=0.0)]


def reach(alphas: list[float]) -> list[float]:
    """[P(position 1 is accepted), P(positions 1..2 are), ...] from per-position acceptances given the
    earlier ones (alphas)."""
    out, run = [], 1.0
    for a in alphas:
        run *= a
        out.append(run)
    return out
