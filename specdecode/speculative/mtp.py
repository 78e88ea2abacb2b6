"""--spec-type draft-mtp: the MTP heads carried in the model file draft a chain of tokens.

Positions: the root t_n sits at position n = len(tokens) - 1. The MTP entry at position j is the real pair
(h_j, t_{j+1}) (the target's final hidden state at j and the token after it); the pair at n - 1 gives draft 1.
Draft s > 1 comes from (g, d_{s-1}) at position n + s - 2, g being the previous step's block output.
Module (s - 1) mod k drafts step s (one module reused when the checkpoint has one).

State per sequence (``seq.draft_state``, a _State):
  slot: slot of the heads' KV cache (one cache layer per module);
  off: first position the cache covers (cache index = position - off): the prompt is covered from at
    most PROMPT_WINDOW positions back;
  fed: every module's cache holds the real pairs of positions off .. fed - 1;
  h [r, H], hpos: target hidden states of positions hpos .. not fed yet (handed to ``commit`` after each
    verify: root + accepted rows).
Chained entries lie past ``fed`` and are simply not counted: the next proposal overwrites those positions
with real pairs, so every commit rolls them back. The prompt's hidden states come from the target's own
prefill (``prefill``); those the engine never handed over (a prefix-cache hit) are recomputed from the
target's KV cache, which is read, never written (``Target.hidden_states``). A finished request's state
is kept for its target slot's next request (speculative/kept.py): after a prefix-cache hit the heads
keep their pairs of the shared tokens; a slot's tokens that move to the host prompt store take a copy of
that state along (``stash``), which a hit from the store resumes alike; a prompt that shares a running
request's prefix (``share``) copies that request's pairs and hidden states of it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import SpecConfig
from ..errors import ModelFileError
from ..heads import bundled_heads
from ..runtime.context import Context, use_context
from ..runtime.kv_cache import KVCache
from ..runtime.target import Target
from .controller import DraftCost
from .kept import KeptStates
from .proposer import Proposer, Stash, extend_chain
from .tree import DraftTree

PROMPT_WINDOW = 256  # prompt positions (before the first draft) the heads' cache covers


@dataclass
class _State:
    slot: int = -1  # -1 until the first proposal
    off: int = 0
    fed: int = 0
    h: torch.Tensor | None = None  # [r, H] target hidden states not fed yet
    hpos: int = 0  # position of h[0]


def missing_heads_message(model: str) -> str:
    heads = bundled_heads(model)
    head = str(heads[0]) if heads else "DIR"
    where = "" if heads else " (DIR from `specdecode train-head --kind mtp`)"
    return (f"{model}: the model file has no MTP heads (no nextn_predict_layers / num_nextn_predict_layers), so "
            f"--spec-type draft-mtp cannot run; write a file with heads: `specdecode attach-mtp --model {model} "
            f"--head {head} --out FILE`{where}, then pass --model FILE")


class MTPProposer(Proposer):
    name = "draft-mtp"
    reads_hidden = True

    def __init__(self, spec: SpecConfig, target: Target, head=None):
        """``head``: an already loaded MTPHead (tests); else read from the target's own model file."""
        from ..loader.mtp_ckpt import load_mtp_head, mtp_layer_count
        from ..store import resolve_model

        if head is None:
            path = resolve_model(target.name, auto_pull=False)
            if mtp_layer_count(path) == 0:
                raise ModelFileError(missing_heads_message(target.name))
            head = load_mtp_head(path, target.model.cfg, target.dtype, target.device)
        self.spec, self.head, self.target = spec, head, target
        self.k = head.cfg.num_modules
        mc = target.model.cfg
        # one slot per target slot plus a scratch slot for cost calibration
        self.kv = KVCache(self.k, target.kv.num_slots + 1, target.kv.max_len, mc.num_kv_heads, mc.head_dim,
                          target.dtype, target.device)
        self.device, self.dtype, self.timer = target.device, target.dtype, target.timer
        self._cost = DraftCost(self._calibrate)
        self._kept = KeptStates(self._free)

    # -- forward helpers ---------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, m: int, slots: list[int], starts: list[int], ids: list[list[int]], hidden: list[torch.Tensor],
             positions: list[list[int]]) -> torch.Tensor:
        """Module m over each row's new pairs (ids[b] tokens, hidden[b] [n_b, H], at cache index starts[b]);
        returns the block output of each row's last pair [B, H]."""
        B, n = len(slots), [len(x) for x in ids]
        T, H = max(n), hidden[0].shape[-1]
        tok = torch.zeros(B, T, dtype=torch.long)
        pos = torch.zeros(B, T, dtype=torch.long)
        hid = hidden[0].new_zeros(B, T, H)
        for b in range(B):
            tok[b, :n[b]], pos[b, :n[b]] = torch.tensor(ids[b]), torch.tensor(positions[b])
            hid[b, :n[b]] = hidden[b]
        ctx = Context(self.kv, slots, starts, n, backend=self.target.attention)
        with use_context(ctx, self.device):
            g = self.head(m, tok.to(self.device), hid, pos.to(self.device), self.target.model)
        return g[torch.arange(B, device=self.device), torch.tensor(n, device=self.device) - 1]

    def _state(self, seq) -> _State:
        if seq.draft_state is None:
            kept = self._kept.take(seq)
            seq.draft_state = _State() if kept is None else self._resume(kept, seq.num_cached)
        return seq.draft_state

    def _resume(self, st: _State, reused: int) -> _State:
        """The previous request's state, cut back to what its first ``reused`` tokens determine: the pair
        at j (h_j, t_{j+1}) while j + 1 < reused, kept hidden states at positions < reused."""
        if st.h is not None:
            st.h = st.h[:reused - st.hpos] if reused > st.hpos else None
        if st.slot >= 0:
            st.fed = min(st.fed, reused - 1)
            if st.fed <= st.off:
                self._free(st)
                st.slot, st.off, st.fed = -1, 0, 0
        return st

    def _free(self, st: _State) -> None:
        if st.slot >= 0:
            self.kv.free(st.slot)

    def _pending(self, seq) -> tuple[list[int], torch.Tensor, int] | None:
        """The real pairs to feed before drafting: (tokens t_{j+1}, hidden [r, H], first position j)."""
        n = len(seq.tokens) - 1
        st = self._state(seq)
        if st.slot < 0:
            st.slot = self.kv.allocate()
            st.off = st.fed = max(0, n - PROMPT_WINDOW)
        if n - st.fed > PROMPT_WINDOW:  # a long stretch without drafting: start the cache afresh
            st.off = st.fed = n - PROMPT_WINDOW
        fed = st.fed
        if fed >= n:
            return None
        h, hpos, st.h = st.h, st.hpos, None
        if h is None or hpos + len(h) != n:  # nothing usable handed over: recompute it all
            h, hpos = None, n
        lo = max(fed, hpos)
        parts = [self.target.hidden_states(seq.slot, seq.tokens, fed, lo)[0]] if lo > fed else []
        if h is not None and lo < n:
            parts.append(h[lo - hpos:])
        return seq.tokens[fed + 1:n + 1], torch.cat(parts), fed

    # -- the proposer contract ---------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs, max_tokens):
        drafts: list[list[int]] = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        feed = {b: p for b, k in enumerate(max_tokens) if k > 0 and (p := self._pending(seqs[b])) is not None}
        active = list(feed)
        if not active:
            return [DraftTree.empty() for _ in seqs]
        sts = [seqs[b].draft_state for b in active]
        n = {b: len(seqs[b].tokens) - 1 for b in active}  # root positions
        t0 = self.timer.now()
        # step 1: every module's cache takes the real pairs; module 0's output at position n - 1 drafts
        g = [self._run(m, [s.slot for s in sts], [feed[b][2] - s.off for b, s in zip(active, sts)],
                       [feed[b][0] for b in active], [feed[b][1] for b in active],
                       [list(range(feed[b][2], n[b])) for b in active]) for m in range(self.k)][0]
        timed = self.k == 1 and all(len(feed[b][0]) == 1 for b in active)  # a plain one-token step
        for s, b in zip(sts, active):
            s.fed = n[b]
        chained = {b: [0] * self.k for b in active}  # chained entries each module wrote in this proposal
        step = 1
        while True:
            logits = self.head.compute_logits((step - 1) % self.k, g, self.target.model)  # [B, V]
            if timed:
                self._cost.observe(len(active), self.timer.now() - t0)
            still, rows = [], []
            for row, b in enumerate(active):
                if extend_chain(drafts[b], qs[b], logits[row], seqs[b], self.spec.draft_p_min, max_tokens[b]):
                    still.append(b)
                    rows.append(row)
            if not still:
                break
            # step s = step + 1: module m feeds (g, d_{s-1}) at position n + s - 2, after its real pairs and
            # its own earlier chained entries
            active, step, m, t0, timed = still, step + 1, step % self.k, self.timer.now(), True
            sts = [seqs[b].draft_state for b in active]
            g = self._run(m, [s.slot for s in sts], [s.fed - s.off + chained[b][m] for s, b in zip(sts, active)],
                          [[drafts[b][-1]] for b in active], [g[r:r + 1] for r in rows],
                          [[n[b] + step - 2] for b in active])
            for b in active:
                chained[b][m] += 1
        return [DraftTree.chain(d, torch.stack(q) if q else None) for d, q in zip(drafts, qs)]

    def prefill(self, seq, start, end, hidden):
        """Keeps the prompt's hidden states (positions start .. end - 1) from the target's prefill, so the
        first proposal recomputes none of them through the target."""
        self._collect(seq, hidden[0], start)

    def prefill_start(self, seq, cached):
        """After a prefix-cache hit: the first of the ``cached`` positions whose hidden state the heads
        will lack at their first proposal (from the first pair they have not fed, a kept slot's, but
        never more than PROMPT_WINDOW back, where ``_pending`` starts a new cache), so the engine's
        prefill hands it over and ``_pending`` recomputes nothing."""
        st = self._state(seq)
        lo = max(st.fed if st.slot >= 0 else 0, cached - PROMPT_WINDOW, 0)
        have = st.hpos + len(st.h) if st.h is not None and st.hpos <= lo else lo
        return min(have, cached)

    @torch.inference_mode()
    def share(self, seq, donor, n):
        """A copy of the donor's state, cut back as a kept state is after a prefix-cache hit (``_resume``):
        its pairs and pending hidden states of the n shared positions, so neither the prefill nor the
        first proposal computes them again."""
        src = donor.draft_state
        if seq.draft_state is not None or seq.num_cached or src is None:
            return self.prefill_start(seq, n)
        self._kept.take(seq)  # frees the state kept under seq's slot, whose tokens seq does not reuse
        st = _State(off=src.off, hpos=src.hpos, h=None if src.h is None else src.h.clone())
        fed = min(src.fed, n - 1) if src.slot >= 0 else src.off
        if fed > src.off:  # cache index = position - off
            st.slot, st.fed = self.kv.allocate(), fed
            self.kv.copy_prefix(src.slot, st.slot, fed - src.off)
        seq.draft_state = self._resume(st, n)
        return self.prefill_start(seq, n)

    def commit(self, seq, num_accepted, hidden):
        """Keeps the target hidden states of the rows the verify committed (positions len(tokens) - a - 2 ..
        len(tokens) - 2) for the next proposal; chained cache entries need no rollback (see the module doc)."""
        if hidden is not None:
            self._collect(seq, hidden[0], len(seq.tokens) - 1 - len(hidden[0]))  # [a + 1, H]

    def _collect(self, seq, h: torch.Tensor, start: int) -> None:
        """Target hidden states h [r, H] of positions start .. start + r - 1, not fed yet."""
        st = self._state(seq)
        if st.h is not None and st.hpos + len(st.h) == start:  # steps without a proposal: keep collecting
            h, start = torch.cat([st.h, h]), st.hpos
        if len(h) > PROMPT_WINDOW:
            h, start = h[-PROMPT_WINDOW:], start + len(h) - PROMPT_WINDOW
        st.h, st.hpos = h, start

    def release(self, seq):
        self._kept.keep(seq, seq.draft_state)
        seq.draft_state = None

    @torch.inference_mode()
    def stash(self, slot):
        """A host copy of the state kept under target slot ``slot``: the heads' pairs of positions off ..
        fed - 1 (k, v [modules, Hkv, fed - off, D]) and the hidden states not fed yet."""
        st = self._kept.peek(slot)
        if st is None or (st.slot < 0 and st.h is None):
            return None
        k, v = self.kv.read(st.slot, st.fed - st.off) if st.slot >= 0 else (None, None)
        h = None if st.h is None else st.h.to("cpu", copy=True)
        nbytes = sum(t.nbytes for t in (k, v, h) if t is not None)
        return Stash((_State(-1, st.off, st.fed, h, st.hpos), k, v), nbytes)

    @torch.inference_mode()
    def unstash(self, seq, stash):
        """Resumes a stashed state (pairs in a slot of its own), cut back to the positions the store hit
        covers as a kept state is (``_resume``). The stash stays the store's: copied, not taken."""
        old, k, v = stash.state
        st = self._state(seq)  # fresh: a store hit reuses none of the tokens the slot kept
        st.off, st.hpos = old.off, old.hpos
        st.h = None if old.h is None else old.h.to(self.device, copy=True)
        if k is not None:
            st.slot, st.fed = self.kv.allocate(), old.fed
            self.kv.load(st.slot, k, v)
        seq.draft_state = self._resume(st, seq.num_prefilled)

    # -- cost ----------------------------------------------------------------------------------------
    @property
    def max_tokens(self) -> int:
        return self.spec.draft_max

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost(n_seqs)

    def _calibrate(self, n_seqs: int) -> float:
        """One chained step (block + LM head) for n_seqs rows on a scratch slot, best of 3."""
        H = self.target.model.cfg.hidden_size
        zero = torch.zeros(32, H, dtype=self.dtype, device=self.device)

        def step():
            g = self._run(0, [slot] * n_seqs, [32] * n_seqs, [[0]] * n_seqs, [zero[:1]] * n_seqs, [[32]] * n_seqs)
            self.head.compute_logits(0, g, self.target.model).argmax(-1)

        with self.kv.scratch_slot() as slot:
            self._run(0, [slot], [0], [[0] * 32], [zero], [list(range(32))])
            return self.timer.best_of(step)
