"""Several drafters behind one proposer (``--spec-type suffix,ngram-mod,draft``, and ``auto``): per step
and per sequence, the draft comes from the member with the best expected tokens per unit of cost.

Each member keeps its own per-request state (a ``MemberView`` gives it its own ``draft_state``) and its own
acceptance record per request. A model member's prior is its engine-wide record (``pools``, which a
request's records join when it finishes; see controller.py): a new request starts from what it recently
achieved, not from the optimistic prior. Every record fades each step, the chosen member's or not, so a
member that lost is tried again once its records have faded back. Draftless members (n-gram kinds,
suffix) cost microseconds, so ``plan`` runs them first: one that finds a draft is a candidate valued on
what it found (its record counts only steps where it drafted). Where a draftless member classes its
drafts by their evidence (``DraftTree.evidence``: suffix's match length and branch frequency), a request
keeps a record per class, whose prior is the class's engine-wide record (``class_pools``: fed by finished
requests as a model member's pool): a one-token match and a repeated paragraph are not one drafter's
average, and how often each class is right is the drafter's trait, while a record of all its drafts
would take its prior from requests whose matches were of another kind. A class pool starts from the
drafter's measured acceptance for the class (``Proposer.evidence_prior``), else the optimistic prior; it
fades per finished request (CLASS_FADE), not per step: what it holds is a property of the drafter and the
model, which a run of steps without releases (one long request, a batch whose requests all finish late)
does not change; a class no request drafts any more still drifts back to that prior and is tried again.

A draftless draft that is found but not verified (another member drafted, or the step decoded plainly)
still counts in its record, as far as the step's emitted tokens show it right or wrong (``commit``: its
match against them, censored at their number). Its drafter would otherwise learn only on the steps it
drafts, and where drafting is dear (a full batch) it rarely does: its records then rest near the
optimistic prior and it drafts as soon as the batch shrinks. A greedy target emits what verification
would have accepted, and a sampled one draws each emitted token as verification would, so such an
observation has the distribution of a verified one. Model members (a draft model, EAGLE, MTP)
are valued on their record and measured cost without running them. The best candidate drafts if it beats
plain decoding; otherwise the sequence decodes plainly this step. Every member sees every prefill,
commit and release, so whichever is chosen next has its state up to date.

Merging (``--spec-merge``): a model member's draft and a draftless member's may be verified as one tree
(speculative/chain_state.py says how ``plan`` values the union and credits each member)."""
from __future__ import annotations

from typing import Callable

from .chain_state import ChainState, MemberView, identity, reach, union_reach
from .controller import CLASS_FADE, AcceptanceEstimate, catch_up_share
from .proposer import Proposer, Stash
from .tree import DraftTree


class ChainProposer(Proposer):
    name = "chain"
    chain_drafts = False  # members' drafts are valued by plan(), not as fixed-length chains

    def __init__(self, members: list[Proposer], merge: str = "auto"):
        self.merge = merge  # auto: merge drafts where plan finds it pays; always (tests); off
        # draftless members first: they are tried before any model drafter is valued
        self.members = sorted(members, key=lambda m: not m.draftless)
        self.name = ",".join(m.name for m in self.members)
        self.reads_hidden = any(m.reads_hidden for m in members)
        self.capture_layers = tuple(sorted({i for m in members for i in m.capture_layers}))
        self._chosen: set[int] = set()
        # each model member's engine-wide record (None: a draftless member keeps the fixed prior)
        self.pools = [None if m.draftless else AcceptanceEstimate(prior=m.prior_acceptance) for m in self.members]
        # each member's engine-wide record per evidence class: a class's prior for every request
        self.class_pools: list[dict[int, AcceptanceEstimate]] = [{} for _ in self.members]

    # -- per-sequence state -----------------------------------------------------------------------
    def _st(self, seq) -> ChainState:
        if seq.draft_state is None:
            n = len(self.members)
            seq.draft_state = ChainState([None] * n, [AcceptanceEstimate(pool=p) for p in self.pools],
                                         [{} for _ in range(n)])
        return seq.draft_state

    def _record(self, st: ChainState, i: int) -> AcceptanceEstimate:
        return st.record(i, self.class_pools[i], self.members[i])

    def _view(self, seq, i: int) -> MemberView:
        return MemberView(seq, self._st(seq).members, i)

    # -- choosing -----------------------------------------------------------------------------------
    def plan(self, seqs, rooms: list[int], value: Callable, fixed: bool = False,
             verify: Callable[[int], float] | None = None) -> None:
        """Chooses each sequence's member for this step, and whether a draftless draft joins it.
        value(alphas, cost, depth, k_max, catch_up) -> (tokens per second of the best draft length up to
        k_max, that length); k = 0 is plain decoding; catch_up: a one-off cost of drafting at all.
        verify(t): the batch's verify forward over t tokens per row (None: no merging)."""
        n = len(seqs)
        self._chosen = set()
        for p in self.pools:  # once per engine step
            if p is not None:
                p.decay()
        for seq, room in zip(seqs, rooms):
            st = self._st(seq)
            st.choice, st.ready, st.merged, st.room, st.own, st.matched, st.cls = None, {}, None, room, None, {}, {}
            st.seen, st.proposed = {}, False
            if room <= 0:
                continue
            if fixed:
                self._fixed_choice(seq, st, room)
            else:
                self._valued_choice(seq, st, room, n, value, verify)
            for i in st.ready:
                if i != st.choice and (st.merged is None or i != st.merged[0]):
                    self.members[i].discard(self._view(seq, i))
            if st.choice is not None:
                self._chosen.add(st.choice)

    def _find(self, seq, st: ChainState, i: int, room: int) -> bool:
        """Runs draftless member i on seq; keeps what it found in st.ready."""
        m = self.members[i]
        tree = m.propose([self._view(seq, i)], [min(room, m.max_tokens)])[0]
        if len(tree):
            st.ready[i] = tree
            if tree.evidence:
                st.cls[i] = tree.evidence
        return bool(len(tree))

    def _fixed_choice(self, seq, st: ChainState, room: int) -> None:
        """--draft-fixed: the first member with a draft drafts. With --spec-merge always, the first
        model member drafts whenever there is one, and the first draftless draft found joins it."""
        models = [i for i, m in enumerate(self.members) if not m.draftless]
        for i, m in enumerate(self.members):
            if not m.draftless:
                st.choice = i
                return
            if self._find(seq, st, i, room):
                if self.merge == "always" and models:
                    st.choice, st.merged = models[0], (i, len(st.ready[i]))
                else:
                    st.choice = i
                return

    def _valued_choice(self, seq, st: ChainState, room: int, n: int, value: Callable, verify) -> None:
        best, best_rate, best_k = None, value([], 0.0, identity, 0)[0], 0
        for i, m in enumerate(self.members):
            if m.draftless:
                if not self._find(seq, st, i, room):
                    continue
                k_max = min(len(st.ready[i]), room)
                catch_up = 0.0
            else:
                k_max = min(room, m.max_tokens)
                catch_up = m.catch_up_cost([self._view(seq, i)])
            rate, k = value(self._record(st, i).alphas(m.depth(k_max)), m.draft_cost(n), m.depth, k_max, catch_up)
            if rate > best_rate:
                best, best_rate, best_k = i, rate, k
        st.choice = best
        if best is None or self.members[best].draftless or not st.ready or verify is None or self.merge == "off":
            return
        m = self.members[best]
        d = m.depth(best_k)
        cost = m.draft_cost(n) * d + catch_up_share(m.catch_up_cost([self._view(seq, best)]))  # as value prices it
        base = reach(self._record(st, best).alphas(d))
        for i, tree in st.ready.items():
            depths = tree.depths()
            ps = reach(self._record(st, i).alphas(max(depths)))
            for j in range(1, min(len(tree), room - best_k) + 1):
                gain = 1.0 + sum(union_reach(base, ps[:max(depths[:j])]))
                rate = gain / (cost + verify(best_k + j + 1))
                if rate > best_rate or self.merge == "always":
                    best_rate, st.merged = rate, (i, j)

    def estimate(self, seq, k: int) -> list[float]:
        st = self._st(seq)
        if st.choice is None:
            return []
        m = self.members[st.choice]
        alphas = self._record(st, st.choice).alphas(m.depth(k))
        if st.choice in st.ready:  # positions beyond what was found gain nothing
            alphas = alphas[:m.depth(len(st.ready[st.choice]))]
        if st.merged is not None:  # the union reaches position d if either draft does (see the module doc)
            i, j = st.merged
            tree = st.ready[i]
            other = reach(self._record(st, i).alphas(max(tree.depths()[:j])))
            both = union_reach(reach(alphas), other)
            alphas = [r / q if q > 0 else 0.0 for r, q in zip(both, [1.0] + both)]
        return alphas

    def observe(self, seq, k: int, drafted: int, accepted: int) -> None:
        st = self._st(seq)
        for i, m in enumerate(self.members):
            d, a = 0, 0
            if i in st.matched:  # a merged step: each member's own draft and its own match
                d, a = max((st.own if i == st.choice else st.ready[i]).depths(), default=0), st.matched[i]
            elif i == st.choice:
                d, a = drafted, accepted
            if d:
                d = d if m.draftless or not m.chain_drafts else max(k, d)
            elif i in st.seen:  # a draft found and not verified, judged by what the step emitted
                d, a = st.seen[i]
            drafting = self._record(st, i) if d else None
            for est in (st.acceptance[i], *st.evidence[i].values()):  # the others rest
                if est is drafting:
                    est.observe(d, a)
                else:
                    est.rest()

    def drafted_by(self, seq) -> str:
        st = self._st(seq)
        if st.choice is None:
            return "none"
        if st.matched:
            return "+".join(self.members[i].name for i in sorted(st.matched))
        return self.members[st.choice].name

    def draft_cost(self, n_seqs: int = 1) -> float:
        return max((self.members[i].draft_cost(n_seqs) for i in self._chosen), default=0.0)

    def catch_up_cost(self, seqs) -> float:
        return sum(self.members[st.choice].catch_up_cost([self._view(seq, st.choice)])
                   for seq in seqs for st in [self._st(seq)] if st.choice is not None)

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
            if st.choice is None or k <= 0:  # plain decoding this step: nothing found is verified
                for i in st.ready:
                    self.members[i].discard(self._view(seq, i))
                st.choice, st.merged, st.own, st.matched = None, None, None, {}  # ready stays: commit judges it
                continue
            st.proposed = True
            if st.choice in st.ready:  # the first k nodes of a tree are closed under ancestors
                t = st.ready[st.choice]
                trees[b] = DraftTree(t.tokens[:k], t.parents[:k], None if t.draft_probs is None else t.draft_probs[:k])
            else:
                groups.setdefault(st.choice, []).append(b)
        for i, rows in groups.items():
            cap = self.members[i].max_tokens
            out = self.members[i].propose([self._view(seqs[b], i) for b in rows], [min(max_tokens[b], cap) for b in rows])
            for b, t in zip(rows, out):
                trees[b] = self._merge(seqs[b], t)
        return trees

    def _merge(self, seq, tree: DraftTree) -> DraftTree:
        """The chosen model member's draft, with the draftless draft plan merged into it (if any)."""
        st = self._st(seq)
        if st.merged is None:
            return tree
        i, j = st.merged
        if tree.draft_probs is not None:  # a sampled draft is verified alone (module doc)
            self.members[i].discard(self._view(seq, i))
            st.merged = None
            return tree
        other = st.ready[i]
        union, held = tree.union(DraftTree(other.tokens[:j], other.parents[:j]), max(st.room, len(tree)))
        st.own, st.ready[i] = tree, DraftTree(other.tokens[:held], other.parents[:held])
        return union

    def prefill(self, seq, start, end, hidden):
        for i, m in enumerate(self.members):
            m.prefill(self._view(seq, i), start, end, hidden if m.reads_hidden else None)

    def prefill_start(self, seq, cached):
        return min(m.prefill_start(self._view(seq, i), cached) for i, m in enumerate(self.members))

    def share(self, seq, donor, n):
        return min(m.share(self._view(seq, i), self._view(donor, i), n) for i, m in enumerate(self.members))

    def stash(self, slot):
        """Each member's stash of the state it kept under ``slot`` (None where it kept none)."""
        parts = [m.stash(slot) for m in self.members]
        if not any(parts):
            return None
        return Stash(parts, sum(p.nbytes for p in parts if p is not None))

    def unstash(self, seq, stash):
        for i, (m, part) in enumerate(zip(self.members, stash.state)):
            if part is not None:
                m.unstash(self._view(seq, i), part)

    def commit(self, seq, num_accepted, hidden):
        st = self._st(seq)
        if st.own is not None:  # a merged step: credit each member with its own draft's match
            accepted = seq.tokens[-1 - num_accepted:-1]  # the draft tokens past the root
            i = st.merged[0]
            st.matched = {st.choice: st.own.match(accepted), i: st.ready[i].match(accepted)}
        # the drafts plan found that this step did not verify (all of them where propose built nothing)
        verified = {st.choice, st.merged and st.merged[0]} if st.proposed else set()
        unverified = {i: tree for i, tree in st.ready.items() if i not in verified}
        if unverified:  # what the step emitted after the root: accepted draft tokens and the target's
            emitted = seq.tokens[-1 - num_accepted:]
            for i, tree in unverified.items():
                seen = min(max(tree.depths()), len(emitted))
                st.seen[i] = (seen, min(tree.match(emitted), seen))
        for i, m in enumerate(self.members):
            if i == st.choice:
                n = num_accepted  # what the sequence now holds past the root, whoever drafted it
            else:
                n = st.matched.get(i, 0)
            m.commit(self._view(seq, i), n, hidden if m.reads_hidden else None)

    def release(self, seq):
        if seq.draft_state is None:
            return
        for pool, est in zip(self.pools, seq.draft_state.acceptance):
            if pool is not None:
                pool.absorb(est)
        for pools, records in zip(self.class_pools, seq.draft_state.evidence):
            for pool in pools.values():
                pool.fade(CLASS_FADE)
            for c, est in records.items():
                pools[c].absorb(est)
        for i, m in enumerate(self.members):
            m.release(self._view(seq, i))
        seq.draft_state = None
