"""--spec-type draft-mtp: the MTP heads carried in the model file draft a chain of tokens.

Positions: the root t_n sits at position n = len(tokens) - 1. The MTP entry at position j is the real pair
(h_j, t_{j+1}) (the target's final hidden state at j and the token after it); the pair at n - 1 gives draft 1.
Draft s > 1 comes from (g, d_{s-1}) at position n + s - 2, g being the previous step's block output.
Module (s - 1) mod k drafts step s (one module reused when the checkpoint has one).

State per sequence (seq.spec_state):
  mtp_slot: slot of the heads' KV cache (one cache layer per module);
  mtp_off: first position the cache covers (cache index = position - mtp_off): the prompt is covered from at
    most PROMPT_WINDOW positions back;
  mtp_fed: every module's cache holds the real pairs of positions mtp_off .. mtp_fed - 1;
  mtp_h [r, H], mtp_hpos: target hidden states of positions mtp_hpos .. not fed yet (from seq.hidden, which
    the engine sets after each verify: root + accepted rows).
Chained entries lie past mtp_fed and are simply not counted: the next proposal overwrites those positions
with real pairs, so every commit rolls them back. Hidden states the engine never handed over (the prompt,
a prefix-cache hit) are recomputed from the target's own KV cache, which is read, never written."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import SpecConfig
from ..runtime.context import Context, use_context
from ..runtime.kv_cache import KVCache
from ..errors import ModelFileError
from .controller import DraftCost
from .proposer import Proposer, extend_chain
from .tree import DraftTree

PROMPT_WINDOW = 256  # prompt positions (before the first draft) the heads' cache covers


class _ReadOnlyPrefix:
    """KV-cache stand-in: the committed keys/values [0, start) of one slot of the target's cache, followed by
    the new ones, without writing them (the target's cache stays bit-identical)."""

    def __init__(self, kv: KVCache, slot: int):
        self.kv, self.slot = kv, slot

    def update(self, layer, k, v, slots, starts, num_new, total_len):
        s, sl = starts[0], self.slot
        return (torch.cat([self.kv.k[layer, sl:sl + 1, :, :s], k], 2),
                torch.cat([self.kv.v[layer, sl:sl + 1, :, :s], v], 2))


def bundled_heads(model: str) -> list[Path]:
    """Head directories in the repository's heads/ trained for ``model`` (config.json base_model)."""
    found = []
    for cfg in sorted((Path(__file__).resolve().parents[2] / "heads").glob("*/config.json")):
        try:
            base = json.loads(cfg.read_text()).get("base_model")
        except (OSError, json.JSONDecodeError):
            continue
        if base in (model, Path(model).stem):
            found.append(cfg.parent)
    return found


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

    def __init__(self, spec: SpecConfig, engine, head=None):
        """``head``: an already loaded MTPHead (tests); else read from the engine's own model file."""
        from ..loader.mtp_ckpt import load_mtp_head, mtp_layer_count
        from ..store import resolve_model

        if head is None:
            path = resolve_model(engine.cfg.model, auto_pull=False)
            if mtp_layer_count(path) == 0:
                raise ModelFileError(missing_heads_message(engine.cfg.model))
            head = load_mtp_head(path, engine.model.cfg, engine.dtype, engine.device)
        self.spec, self.head, self.target = spec, head, engine.model
        self.k = head.cfg.num_modules
        mc = engine.model.cfg
        # one slot per engine slot plus a scratch slot for cost calibration
        self.kv = KVCache(self.k, engine.kv.num_slots + 1, engine.kv.max_len, mc.num_kv_heads, mc.head_dim,
                          engine.dtype, engine.device)
        self.target_kv, self.device, self.dtype, self.now = engine.kv, engine.device, engine.dtype, engine.timer.now
        self._cost = DraftCost(self._calibrate)

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
        ctx = Context(self.kv, slots, starts, n)
        with use_context(ctx, self.device):
            g = self.head(m, tok.to(self.device), hid, pos.to(self.device), self.target)
        return g[torch.arange(B, device=self.device), torch.tensor(n, device=self.device) - 1]

    @torch.inference_mode()
    def _target_hidden(self, seq, start: int, end: int) -> torch.Tensor:
        """The target's final hidden states [end - start, H] of positions start .. end - 1 (all in its cache)."""
        ids = torch.tensor([seq.tokens[start:end]], device=self.device)
        pos = torch.arange(start, end, device=self.device)[None]
        ctx = Context(_ReadOnlyPrefix(self.target_kv, seq.slot), [seq.slot], [start], [end - start])
        with use_context(ctx, self.device):
            return self.target(ids, pos)[0]

    def _pending(self, seq) -> tuple[list[int], torch.Tensor, int] | None:
        """The real pairs to feed before drafting: (tokens t_{j+1}, hidden [r, H], first position j)."""
        st, n = seq.spec_state, len(seq.tokens) - 1
        if "mtp_slot" not in st:
            st["mtp_slot"] = self.kv.allocate()
            st["mtp_off"] = st["mtp_fed"] = max(0, n - PROMPT_WINDOW)
        if n - st["mtp_fed"] > PROMPT_WINDOW:  # a long stretch without drafting: start the cache afresh
            st["mtp_off"] = st["mtp_fed"] = n - PROMPT_WINDOW
        fed = st["mtp_fed"]
        if fed >= n:
            return None
        h, hpos = st.pop("mtp_h", None), st.pop("mtp_hpos", None)
        if h is None or hpos + len(h) != n:  # nothing usable handed over: recompute it all
            h, hpos = None, n
        lo = max(fed, hpos)
        parts = [self._target_hidden(seq, fed, lo)] if lo > fed else []
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
        sts = [seqs[b].spec_state for b in active]
        n = {b: len(seqs[b].tokens) - 1 for b in active}  # root positions
        t0 = self.now()
        # step 1: every module's cache takes the real pairs; module 0's output at position n - 1 drafts
        g = [self._run(m, [s["mtp_slot"] for s in sts], [feed[b][2] - s["mtp_off"] for b, s in zip(active, sts)],
                       [feed[b][0] for b in active], [feed[b][1] for b in active],
                       [list(range(feed[b][2], n[b])) for b in active]) for m in range(self.k)][0]
        timed = self.k == 1 and all(len(feed[b][0]) == 1 for b in active)  # a plain one-token step
        for s, b in zip(sts, active):
            s["mtp_fed"] = n[b]
        chained = {b: [0] * self.k for b in active}  # chained entries each module wrote in this proposal
        step = 1
        while True:
            logits = self.head.compute_logits((step - 1) % self.k, g, self.target)  # [B, V]
            if timed:
                self._cost.observe(len(active), self.now() - t0)
            still, rows = [], []
            for row, b in enumerate(active):
                if extend_chain(drafts[b], qs[b], logits[row], seqs[b], self.spec.draft_p_min, max_tokens[b]):
                    still.append(b)
                    rows.append(row)
            if not still:
                break
            # step s = step + 1: module m feeds (g, d_{s-1}) at position n + s - 2, after its real pairs and
            # its own earlier chained entries
            active, step, m, t0, timed = still, step + 1, step % self.k, self.now(), True
            sts = [seqs[b].spec_state for b in active]
            g = self._run(m, [s["mtp_slot"] for s in sts],
                          [s["mtp_fed"] - s["mtp_off"] + chained[b][m] for s, b in zip(sts, active)],
                          [[drafts[b][-1]] for b in active], [g[r:r + 1] for r in rows],
                          [[n[b] + step - 2] for b in active])
            for b in active:
                chained[b][m] += 1
        return [DraftTree.chain(d, torch.stack(q) if q else None) for d, q in zip(drafts, qs)]

    def commit(self, seq, num_accepted):
        """Keeps the target hidden states of the rows the verify committed (positions kv_len - a - 1 ..
        kv_len - 1) for the next proposal; chained cache entries need no rollback (see the module doc)."""
        if seq.hidden is None:
            return
        st, h = seq.spec_state, seq.hidden[0]  # [a + 1, H]
        start = self.target_kv.lengths[seq.slot] - len(h)
        old, hpos = st.get("mtp_h"), st.get("mtp_hpos")
        if old is not None and hpos + len(old) == start:  # steps without a proposal: keep collecting
            h, start = torch.cat([old, h]), hpos
        if len(h) > PROMPT_WINDOW:
            h, start = h[-PROMPT_WINDOW:], start + len(h) - PROMPT_WINDOW
        st["mtp_h"], st["mtp_hpos"] = h, start

    def release(self, seq):
        st = seq.spec_state
        if "mtp_slot" in st:
            self.kv.free(st.pop("mtp_slot"))
        for key in ("mtp_h", "mtp_hpos", "mtp_off", "mtp_fed"):
            st.pop(key, None)

    # -- cost ----------------------------------------------------------------------------------------
    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost(n_seqs)

    def _calibrate(self, n_seqs: int) -> float:
        """One chained step (block + LM head) for n_seqs rows on the scratch slot, best of 3."""
        slot = self.kv.allocate()
        try:
            H = self.target.cfg.hidden_size
            zero = torch.zeros(32, H, dtype=self.dtype, device=self.device)
            self._run(0, [slot], [0], [[0] * 32], [zero], [list(range(32))])
            best = float("inf")
            for _ in range(3):
                t0 = self.now()
                g = self._run(0, [slot] * n_seqs, [32] * n_seqs, [[0]] * n_seqs, [zero[:1]] * n_seqs, [[32]] * n_seqs)
                self.head.compute_logits(0, g, self.target).argmax(-1)
                best = min(best, self.now() - t0)
            return best
        finally:
            self.kv.free(slot)
