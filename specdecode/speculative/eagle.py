"""EAGLE proposer (``--spec-type eagle3`` / ``eagle``): a draft head on the target's hidden states,
growing a token tree EAGLE-2 style with SGLang's knobs.

Head state per sequence (``seq.draft_state``, a HeadState, speculative/eagle_state.py): a KV cache slot whose
index i holds the head's entry for position base + i (entry j = target features at j + embedding of token j+1;
see models/eagle.py), ``fed`` committed entries, the head's output at the newest of them (``last``: it drafts
depth 1), and pending target features (handed to ``prefill`` and ``commit``) not fed yet. The prompt's entries
are owed, not fed: the prefill keeps its features pending (``_owed``) and the head's first proposal feeds them,
so a request the controller never drafts with (a full batch, text the head does not predict) never pays for
them. They are not a catch-up: a drafter that fed its prompt during prefill would have paid them whether or not
it drafted, so ``catch_up_cost`` leaves them out and the choice to draft is the one that drafter would make. A
prompt longer than 2 PROMPT_WINDOW is fed as its chunks arrive (what is pending stays bounded). A finished
request's state is kept for its target slot's next request (speculative/kept.py): after a prefix-cache hit the
head keeps the entries (and pending features) of the shared tokens, and only the positions the hit leaves are
fed. A slot's tokens that move to the host prompt store take a copy of that state with them (``stash``), and a
hit from the store resumes it alike (``unstash``); a hit with nothing kept owes the head the PROMPT_WINDOW
positions before it, recomputed by the target when the head first feeds (``_fill_gap``), so that only a
request it drafts for pays. A proposal feeds the pending entries (one verify's worth, or more after steps in
which a chain chose another drafter), then grows the tree (speculative/eagle_tree.py). Draft entries are
written past ``fed`` and never committed: the next commit drops them, and the accepted tokens re-enter with the
target's own features.
Tokens are chosen deterministically (top-k), so the tree carries no draft distributions and the shared accept()
is exact at any temperature (a deterministic draft is the one-hot q)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import SpecConfig
from ..errors import InvalidRequestError
from ..heads import find_head, held_out_acceptance
from ..models.eagle import EagleHead
from ..runtime.context import Context, use_context
from ..runtime.kv_cache import KVCache
from ..runtime.target import Target
from .controller import DraftCost, ema
from .eagle_cost import entry_cost, level_cost
from .eagle_state import HeadState
from .eagle_tree import grow, select
from .kept import KeptStates
from .proposer import Proposer, Stash
from .tree import DraftTree

PROMPT_WINDOW = 256  # prompt positions whose target features are recomputed when none were captured;
# also what a head keeps of its pending (unfed) positions once they pass twice that: the newest ones


class EagleProposer(Proposer):
    chain_drafts = False  # k caps tree nodes, not depth
    reads_hidden = True

    def __init__(self, spec: SpecConfig, target: Target, head: EagleHead | None = None):
        if spec.num_steps < 1 or spec.eagle_topk < 1 or spec.num_draft_tokens < 2:
            raise InvalidRequestError("EAGLE needs --num-steps >= 1, --eagle-topk >= 1, --num-draft-tokens >= 2")
        self.name, self.spec = spec.spec_type, spec
        if head is None:
            from ..loader.eagle_ckpt import load_head

            path = Path(spec.head).expanduser() if spec.head else find_head(target.name, spec.spec_type)
            head = load_head(path, target.model.cfg, target.dtype, target.device)
            self.prior_acceptance = held_out_acceptance(path)
            if head.cfg.kind != spec.spec_type:
                raise InvalidRequestError(f"--spec-type {spec.spec_type} needs a {spec.spec_type} head; {path} "
                                          f"holds a {head.cfg.kind} head")
        self.head = head.to(device=target.device, dtype=target.dtype).bind(target.model)
        if target.device.type == "cpu" and target.dtype in (torch.float32, torch.bfloat16):
            # int4 beside an int4 target (acceptance the same within noise, a 3-level proposal ~20 %
            # cheaper: docs/benchmarks.md, round 30); int8 beside a target that keeps more bits
            self.head.quantize("int4" if getattr(target.model, "quant", None) == "int4" else "int8")
        self.capture_layers = head.capture_layers
        self.target = target
        c, K = head.cfg, spec.eagle_topk
        # one slot per target slot plus a scratch slot for cost calibration; room for one tree of entries
        self.kv = KVCache(1, target.kv.num_slots + 1, target.kv.max_len + spec.num_steps * K + 1,
                          c.num_kv_heads, c.head_dim, target.dtype, target.device)
        self.timer = target.timer
        self._step_cost = DraftCost(self._calibrate)  # seconds per tree level
        self._entry_cost: float | None = None  # measured seconds per entry fed (a row of _feed_pending's forward)
        self._kept = KeptStates(lambda st: self.kv.free(st.slot))

    def depth(self, k: int) -> int:
        return min(k, self.spec.num_steps)  # one head step per level; nodes beyond are siblings

    @property
    def max_tokens(self) -> int:
        n = self.spec.num_draft_tokens - 1
        return min(n, self.spec.num_steps) if self.spec.eagle_topk == 1 else n

    # -- state -----------------------------------------------------------------------------------
    def _state(self, seq) -> HeadState:
        if seq.draft_state is None:
            kept = self._kept.take(seq)
            seq.draft_state = HeadState(self.kv.allocate()) if kept is None else self._resume(kept, seq.num_cached)
        return seq.draft_state

    def _resume(self, st: HeadState, reused: int) -> HeadState:
        """The previous request's state, cut back to what its first ``reused`` tokens determine: entry j
        (features at j, token j + 1) while j + 1 < reused, pending features at positions < reused (a
        head that never drafted for that request has only those: its prompt was owed)."""
        fed = min(st.fed, reused - 1 - st.base)
        if fed < st.fed:  # the new prompt parts from the old tokens within the head's entries
            st.fed, st.feats, st.last = max(fed, 0), None, None  # the gap up to the new prompt is recomputed
        elif st.feats is not None:  # every entry stays (``last`` too); pending features while shared
            keep = reused - st.fstart
            st.feats = st.feats[:keep] if keep > 0 else None
        if st.fed == 0 and st.feats is None:  # nothing left: a fresh state
            st = HeadState(st.slot)
        self.kv.set_length(st.slot, st.fed)
        return st

    @torch.inference_mode()
    def prefill(self, seq, start, end, hidden):
        """Prompt features from the engine's prefill (positions start .. end - 1), kept pending for the
        first proposal; the window before ``start`` that a prefix-cache hit left (``prefill_start``) is
        recomputed only when they are fed."""
        st = self._state(seq)
        st.add_features(start, self.head.features(*hidden))
        if st.feats is not None and len(st.feats) > 2 * PROMPT_WINDOW:  # a long prompt: fed as it comes
            self._fill_gap(seq, st, end)
            self._feed_pending([seq], [st])

    def prefill_start(self, seq, cached):
        """After a prefix-cache hit: the first of the ``cached`` positions whose features the engine's
        prefill must hand over. A kept state lacks at least the last shared position (its entry pairs
        it with the next token, which the new prompt may change): the prefill starts there. With nothing
        kept (a store hit whose entry came without a stash) the head's entries start PROMPT_WINDOW positions
        back, but the prefill starts after the hit: the window's features are owed, like the prompt's,
        and ``_fill_gap`` recomputes them when the head first feeds, so a request the head never drafts
        for (a full batch, a chain that chooses another drafter) keeps the whole hit, and one it drafts
        for pays what a cold start's prefill would have."""
        st = self._state(seq)
        have = st.base + st.fed
        if st.feats is not None and st.fstart <= have:
            have = max(have, st.fstart + len(st.feats))
        if have >= cached:
            return cached
        if st.fed == 0 and st.feats is None:  # nothing kept: the head's entries start at the window
            st.base = max(0, cached - PROMPT_WINDOW)
            return cached
        return have

    @torch.inference_mode()
    def share(self, seq, donor, n):
        """A copy of the donor's state, cut back as a kept state is after a prefix-cache hit (``_resume``):
        its entries whose next token is shared and its pending features of the n shared positions (in a
        full batch, where the head never drafts, the donor's whole prompt is pending), so the prefill
        need not compute them again."""
        src = donor.draft_state
        if seq.draft_state is not None or seq.num_cached or src is None or (src.fed == 0 and src.feats is None):
            return self.prefill_start(seq, n)
        self._kept.take(seq)  # frees the state kept under seq's slot, whose tokens seq does not reuse
        st = HeadState(self.kv.allocate(), src.base, src.fed, None if src.feats is None else src.feats.clone(),
                    src.fstart, src.last)
        self.kv.copy_prefix(src.slot, st.slot, src.fed)
        seq.draft_state = self._resume(st, n)
        return self.prefill_start(seq, n)

    @torch.inference_mode()  # the pending buffer may be prefill's, made in inference mode
    def commit(self, seq, num_accepted, hidden):
        st = self._state(seq)
        if hidden is not None:
            feats = self.head.features(*hidden)  # [accepted + 1, F]: root + accepted path
            st.add_features(len(seq.tokens) - 1 - len(feats), feats)
            self._bound_pending(seq, st)
        self.kv.set_length(st.slot, st.fed)  # drop the draft entries

    def _bound_pending(self, seq, st: HeadState) -> None:
        """Past 2 PROMPT_WINDOW pending positions, keeps the newest PROMPT_WINDOW: a head not chosen for
        long (a chain drafting with another member, a batch where drafting does not pay) would otherwise
        hold features for the whole answer and feed them all in one stall when chosen. The head then
        restarts at those positions, its older entries dropped, as after a prefix-cache hit whose
        entries were not kept."""
        if st.feats is None or len(st.feats) - self._owed(seq, st) <= 2 * PROMPT_WINDOW:
            return
        drop = len(st.feats) - PROMPT_WINDOW
        st.feats, st.fstart = st.feats[drop:].clone(), st.fstart + drop  # a copy: the old buffer goes
        st.buf = None
        st.base, st.fed, st.last = st.fstart, 0, None
        self.kv.set_length(st.slot, 0)

    def release(self, seq):
        self._kept.keep(seq, seq.draft_state)
        seq.draft_state = None

    @torch.inference_mode()
    def stash(self, slot):
        """A host copy of the state kept under target slot ``slot``: its entries' keys and values (one
        layer's: for the 1.5B's head in float32 2 KB a position, against the target's 28 KB), its pending
        features and ``last``."""
        st = self._kept.peek(slot)
        if st is None or (st.fed == 0 and st.feats is None):
            return None
        k, v = self.kv.read(st.slot, st.fed)  # [1, Hkv, fed, D] each
        feats = None if st.feats is None else st.feats.to("cpu", copy=True)
        last = None if st.last is None else st.last.to("cpu", copy=True)
        nbytes = sum(t.nbytes for t in (k, v, feats, last) if t is not None)
        return Stash((HeadState(-1, st.base, st.fed, feats, st.fstart, last), k, v), nbytes)

    @torch.inference_mode()
    def unstash(self, seq, stash):
        """Resumes a stashed state in a slot of its own, cut back to the positions the store hit covers
        as a kept state is (``_resume``): the head then needs at most the hit's last position again,
        not a window of target forwards (``_fill_gap``). The stash stays the store's: copied, not taken."""
        old, k, v = stash.state
        st = self._state(seq)  # fresh: a store hit reuses none of the tokens the slot kept
        dev = self.head.device
        st.base, st.fed, st.fstart = old.base, old.fed, old.fstart
        st.feats = None if old.feats is None else old.feats.to(dev, copy=True)
        st.last = None if old.last is None else old.last.to(dev, copy=True)
        self.kv.load(st.slot, k, v)
        seq.draft_state = self._resume(st, seq.num_prefilled)

    def _fill_gap(self, seq, st: HeadState, end: int) -> None:
        """Recomputes target features for positions before ``end`` (in the target's cache) that the
        head lacks (a prefix-cache hit, unless the engine passed them), limited to PROMPT_WINDOW."""
        have = st.fstart if st.feats is not None else end
        if have <= st.base + st.fed:
            return
        a = max(0, have - PROMPT_WINDOW) if st.fed == 0 else st.base + st.fed
        if st.fed == 0:
            st.base = a
        gap = self.head.features(*self.target.hidden_states(seq.slot, seq.tokens, a, have, self.capture_layers))
        st.feats = gap if st.feats is None else torch.cat([gap, st.feats])
        st.fstart = a

    # -- drafting --------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs, max_tokens):
        trees = [DraftTree.empty() for _ in seqs]
        rows = []
        for b, seq in enumerate(seqs):
            if max_tokens[b] > 0:
                st = self._state(seq)
                self._fill_gap(seq, st, len(seq.tokens) - 1)  # the target's committed length
                if st.feats is not None or st.last is not None:
                    rows.append(b)
        if not rows:
            return trees
        t0 = self.timer.now()
        states = [seqs[b].draft_state for b in rows]
        pending = [i for i, st in enumerate(states) if st.feats is not None]
        # More than one verify commits (root + a path of at most num_steps): a catch-up after steps the
        # head did not draft, a one-off cost that is not a tree level's (catch_up_cost prices it). Each
        # is fed alone: one forward pads every row to the longest, and the others have a few entries.
        long = [i for i in pending if self._bulk(len(states[i].feats))]
        for i in long:
            self._feed_pending([seqs[rows[i]]], [states[i]])
        short = [i for i in pending if i not in long]
        if short:
            self._feed_pending([seqs[rows[i]] for i in short], [states[i] for i in short])
        catch_up = bool(long)
        x_last = torch.stack([st.last for st in states])
        keep = [min(max_tokens[b], self.max_tokens) for b in rows]
        steps = min(self.spec.num_steps, max(keep))
        cands = grow(self.head, self.kv, self.target.attention, self.spec.eagle_topk, x_last,
                     [(st.slot, st.fed) for st in states], [len(seqs[b].tokens) - 1 for b in rows], steps)
        for i, b in enumerate(rows):
            trees[b] = select(cands[i], keep[i])
        if not catch_up:
            self._step_cost.observe(len(rows), (self.timer.now() - t0) / steps)
        return trees

    def _feed_pending(self, seqs, states) -> None:
        """Feeds every row's pending entries (causal; KV index = position - base), commits them and
        keeps the pre-norm output of each row's last entry (``last``: it drafts depth 1)."""
        h, dev = self.head, self.head.device
        n = [len(st.feats) for st in states]
        T, B = max(n), len(states)
        t0 = self.timer.now()
        ids = torch.zeros(B, T, dtype=torch.long)
        pos = torch.zeros(B, T, dtype=torch.long)
        feats = torch.zeros(B, T, states[0].feats.shape[-1], dtype=states[0].feats.dtype, device=dev)
        for b, (seq, st) in enumerate(zip(seqs, states)):
            ids[b, :n[b]] = torch.tensor(seq.tokens[st.fstart + 1:st.fstart + 1 + n[b]])  # entry j reads token j+1
            pos[b, :n[b]] = torch.arange(st.fstart, st.fstart + n[b])
            feats[b, :n[b]] = st.feats
        ctx = Context(self.kv, [st.slot for st in states], [st.fed for st in states], n,
                      backend=self.target.attention)  # causal among each row's new entries
        with use_context(ctx, dev):
            x = h.step(h.embed(ids.to(dev)), h.project(feats), pos.to(dev))
        for b, (st, k) in enumerate(zip(states, n)):
            st.fed += k
            st.feats = st.buf = None
            st.last = x[b, k - 1].clone()  # not a view that keeps the whole forward's output
            self.kv.set_length(st.slot, st.fed)
        if self._bulk(T):  # a prompt chunk or a catch-up: what an entry costs in bulk
            self._entry_cost = ema(self._entry_cost, (self.timer.now() - t0) / (B * T))

    # -- cost ------------------------------------------------------------------------------------
    def _owed(self, seq, st: HeadState) -> int:
        """Pending rows at prompt positions (before the root): prefill's to feed, no catch-up (module doc).
        A commit appends answer positions after them; a feed or a bounded restart leaves none."""
        if st.feats is None:
            return 0
        return min(len(st.feats), max(0, len(seq.prompt_ids) - 1 - st.fstart))

    def _bulk(self, entries: int) -> bool:
        """More entries than one verify commits (the root and a path of at most num_steps): a prompt
        chunk or a catch-up, not part of a tree level's cost."""
        return entries > self.spec.num_steps + 1

    def catch_up_cost(self, seqs) -> float:
        """The entries a proposal would feed first, beyond one verify's commit (those are part of a
        tree level's measured cost) and those prefill owes (the module doc), at the measured cost of
        an entry fed in bulk."""
        n = sum(m for seq in seqs for st in [seq.draft_state] if st is not None and st.feats is not None
                for m in [len(st.feats) - self._owed(seq, st)] if self._bulk(m))
        if n and self._entry_cost is None:  # no bulk feed yet (prompts are owed): measure one
            self._entry_cost = self._calibrate_entries()
        return n * (self._entry_cost or 0.0)

    def draft_cost(self, n_seqs: int = 1) -> float:
        """Seconds per drafted node: a head forward per tree level, spread over the nodes kept."""
        n = self.max_tokens
        return self._step_cost(n_seqs) * min(self.spec.num_steps, n) / n

    def _calibrate(self, n_seqs: int) -> float:
        return level_cost(self.head, self.kv, self.target.attention, self.timer, n_seqs, self.spec.eagle_topk)

    def _calibrate_entries(self) -> float:
        return entry_cost(self.head, self.kv, self.target.attention, self.timer)
