"""Several drafters behind one proposer (``--spec-type suffix,ngram-mod,draft``, and ``auto``): per step
and per sequence, the draft comes from the member with the best expected tokens per unit of cost.

Each member keeps its own per-request state (a ``_View`` gives it its own ``draft_state``) and its own
acceptance record per request. A model member's prior is its engine-wide record (``pools``, which a
request's records join when it finishes; see controller.py): a new request starts from what it recently
achieved, not from the optimistic prior. Every record fades each step, the chosen member's or not, so a
member that lost is tried again once its records have faded back. Draftless members (n-gram kinds,
suffix) cost microseconds, so ``plan`` runs them first: one that finds a draft is a candidate valued on
what it found (its record counts only steps where it drafted). Model members (a draft model, EAGLE, MTP)
are valued on their record and measured cost without running them. The best candidate drafts if it beats
plain decoding; otherwise the sequence decodes plainly this step. Every member sees every prefill,
commit and release, so whichever is chosen next has its state up to date."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .controller import AcceptanceEstimate
from .proposer import Proposer
from .tree import DraftTree


class _View:
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
class _State:
    members: list  # each member's own draft_state
    acceptance: list[AcceptanceEstimate]  # each member's record for this request
    choice: int | None = None  # the member drafting this step (None: plain decoding)
    ready: dict[int, DraftTree] = field(default_factory=dict)  # drafts the draftless members found this step


class ChainProposer(Proposer):
    name = "chain"
    chain_drafts = False  # members' drafts are valued by plan(), not as fixed-length chains

    def __init__(self, members: list[Proposer]):
        # draftless members first: they are tried before any model drafter is valued
        self.members = sorted(members, key=lambda m: not m.draftless)
        self.name = ",".join(m.name for m in self.members)
        self.reads_hidden = any(m.reads_hidden for m in members)
        self.capture_layers = tuple(sorted({i for m in members for i in m.capture_layers}))
        self._chosen: set[int] = set()
        # each model member's engine-wide record (None: a draftless member keeps the fixed prior)
        self.pools = [None if m.draftless else AcceptanceEstimate() for m in self.members]

    # -- per-sequence state -----------------------------------------------------------------------
    def _st(self, seq) -> _State:
        if seq.draft_state is None:
            n = len(self.members)
            seq.draft_state = _State([None] * n, [AcceptanceEstimate(pool=p) for p in self.pools])
        return seq.draft_state

    def _view(self, seq, i: int) -> _View:
        return _View(seq, self._st(seq).members, i)

    # -- choosing -----------------------------------------------------------------------------------
    def plan(self, seqs, rooms: list[int], value: Callable, fixed: bool = False) -> None:
        """Chooses each sequence's member for this step. value(alphas, cost, depth, k_max) -> (tokens
        per second of the best draft length up to k_max, that length); k = 0 is plain decoding."""
        n = len(seqs)
        self._chosen = set()
        for p in self.pools:  # once per engine step
            if p is not None:
                p.decay()
        for seq, room in zip(seqs, rooms):
            st = self._st(seq)
            st.choice, st.ready = None, {}
            if room <= 0:
                continue
            best, best_rate = None, -1.0 if fixed else value([], 0.0, _identity, 0)[0]
            for i, m in enumerate(self.members):
                if m.draftless:
                    tree = m.propose([self._view(seq, i)], [min(room, m.max_tokens)])[0]
                    if not len(tree):
                        continue
                    st.ready[i] = tree
                    if fixed:  # --draft-fixed: the first member with a draft drafts
                        best = i
                        break
                    k_max = min(len(tree), room)
                else:
                    if fixed:
                        best = i
                        break
                    k_max = min(room, m.max_tokens)
                rate = value(st.acceptance[i].alphas(m.depth(k_max)), m.draft_cost(n), m.depth, k_max)[0]
                if rate > best_rate:
                    best, best_rate = i, rate
            for i in st.ready:
                if i != best:
                    self.members[i].discard(self._view(seq, i))
            st.choice = best
            if best is not None:
                self._chosen.add(best)

    def estimate(self, seq, k: int) -> list[float]:
        st = self._st(seq)
        if st.choice is None:
            return []
        m = self.members[st.choice]
        alphas = st.acceptance[st.choice].alphas(m.depth(k))
        if st.choice in st.ready:  # positions beyond what was found gain nothing
            alphas = alphas[:m.depth(len(st.ready[st.choice]))]
        return alphas

    def observe(self, seq, k: int, drafted: int, accepted: int) -> None:
        st = self._st(seq)
        for i, (m, est) in enumerate(zip(self.members, st.acceptance)):
            if i == st.choice and drafted:
                est.observe(drafted if m.draftless or not m.chain_drafts else max(k, drafted), accepted)
            else:
                est.rest()

    def drafted_by(self, seq) -> str:
        st = self._st(seq)
        return "none" if st.choice is None else self.members[st.choice].name

    def draft_cost(self, n_seqs: int = 1) -> float:
        return max((self.members[i].draft_cost(n_seqs) for i in self._chosen), default=0.0)

    def depth(self, k: int) -> int:
        return max((self.members[i].depth(k) for i in self._chosen), default=k)

    @property
    def max_tokens(self) -> int:
        return max(m.max_tokens for m in self.members)

    # -- the proposer contract ----------------------------------------------------------------------
    def propose(self, seqs, max_tokens):
        trees = [DraftTree.empty() for _ in seqs]
        groups: dict[int, list[int]] = {}
        for b, (seq, k) in enumerate(zip(seqs, max_tokens)):
            st = self._st(seq)
            if st.choice is None or k <= 0:
                continue
            if st.choice in st.ready:  # the first k nodes of a tree are closed under ancestors
                t = st.ready[st.choice]
                trees[b] = DraftTree(t.tokens[:k], t.parents[:k], None if t.draft_probs is None else t.draft_probs[:k])
            else:
                groups.setdefault(st.choice, []).append(b)
        for i, rows in groups.items():
            cap = self.members[i].max_tokens
            out = self.members[i].propose([self._view(seqs[b], i) for b in rows], [min(max_tokens[b], cap) for b in rows])
            for b, t in zip(rows, out):
                trees[b] = t
        return trees

    def prefill(self, seq, start, end, hidden):
        for i, m in enumerate(self.members):
            m.prefill(self._view(seq, i), start, end, hidden if m.reads_hidden else None)

    def commit(self, seq, num_accepted, hidden):
        st = self._st(seq)
        for i, m in enumerate(self.members):
            n = num_accepted if i == st.choice else 0
            m.commit(self._view(seq, i), n, hidden if m.reads_hidden else None)

    def release(self, seq):
        if seq.draft_state is None:
            return
        for pool, est in zip(self.pools, seq.draft_state.acceptance):
            if pool is not None:
                pool.absorb(est)
        for i, m in enumerate(self.members):
            m.release(self._view(seq, i))
        seq.draft_state = None


def _identity(k: int) -> int:
    return k
