"""A separate small draft model with its own KV cache, kept in step with the target's.

State per sequence (seq.spec_state): ``draft_slot``; ``draft_len`` = leading tokens of seq.tokens
the draft has passed, ``skipped`` = how many of them it skipped (below): its cache holds the other
draft_len - skipped, each at its true position. A proposal feeds the pending tokens
tokens[draft_len:] (at least the root) and then its own drafts one at a time; ``commit`` keeps what
the target accepted, which the draft had fed, and rolls the rest back by not advancing.

Catch-up: while the controller chooses k = 0 the draft is idle and falls behind; feeding everything
it missed when drafting resumes would cost a forward over all of it (measured on Spec-Bench RAG:
57 ms per resumed step against 21 ms per draft token, which made the re-probes of a text the draft
predicts badly cost 6 % of decode time). It feeds only the last CATCH_UP tokens and skips the rest:
the draft then attends its older context and those tokens, with a hole between, which may lower its
acceptance but never the output's correctness (the target verifies every draft)."""
from __future__ import annotations

import torch

from ..config import SpecConfig
from ..runtime.kv_cache import KVCache
from ..runtime.model_runner import ModelRunner
from ..errors import SpecDecodeError
from ..speculative.controller import DraftCost
from .proposer import Proposer, extend_chain
from .tree import DraftTree

CATCH_UP = 4  # most pending tokens fed when drafting resumes (~1.4x a one-token draft forward)


def check_vocab_compatible(target_tok, draft_tok) -> None:
    """The draft must speak the target's token ids. A padded embedding table (extra unused rows) is
    harmless and allowed; a different tokenizer is refused."""
    if target_tok.vocab_size != draft_tok.vocab_size or any(
            target_tok.id_to_piece(i) != draft_tok.id_to_piece(i) for i in range(target_tok.vocab_size)):
        raise SpecDecodeError(f"the draft model's vocabulary ({draft_tok.vocab_size} tokens) does not match "
                              f"the target's ({target_tok.vocab_size} tokens): use a draft with the same tokenizer")


class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, spec: SpecConfig, engine, model=None, tokenizer=None):
        from ..loader import load_checkpoint
        from ..store import resolve_model

        if model is None:
            model, tokenizer = load_checkpoint(resolve_model(spec.model_draft), engine.dtype, engine.device,
                                               engine.weight_quant(spec.quant_draft))
        check_vocab_compatible(engine.tokenizer, tokenizer)
        self.spec, self.model = spec, model
        self.target_vocab = engine.model.cfg.vocab_size
        mc = model.cfg
        # one slot per engine slot plus a scratch slot for cost calibration
        self.kv = KVCache(mc.num_layers, engine.kv.num_slots + 1, engine.kv.max_len, mc.num_kv_heads,
                          mc.head_dim, engine.kv_dtype(model.quant), engine.device)
        self.runner = ModelRunner(model, self.kv)
        self.now = engine.timer.now
        self._cost = DraftCost(self._calibrate)

    def _logits_in_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V_draft] -> [B, V_target]: drop padded rows, or pad with -inf (q = 0 there)."""
        V = self.target_vocab
        if logits.shape[-1] >= V:
            return logits[..., :V]
        pad = logits.new_full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _state(self, seq) -> dict:
        """The sequence's spec_state, with a draft KV slot (``draft_slot``, ``draft_len`` tokens in it)."""
        st = seq.spec_state
        if "draft_slot" not in st:
            st["draft_slot"], st["draft_len"], st["skipped"] = self.kv.allocate(), 0, 0
        return st

    def prefill(self, seq, start, end, hidden, captured):
        st = self._state(seq)
        if end > st["draft_len"]:
            self.runner.forward([st["draft_slot"]], [seq.prompt_ids[st["draft_len"]:end]],
                                [range(st["draft_len"], end)], logits=False)
            self.kv.set_length(st["draft_slot"], end - st["skipped"])
            st["draft_len"] = end

    def propose(self, seqs, max_tokens):
        drafts = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = [b for b, k in enumerate(max_tokens) if k > 0]
        feed = {}
        for b in active:
            st = self._state(seqs[b])
            if st["draft_len"] < len(seqs[b].prompt_ids) - 1:
                # The target took this prompt from its prefix cache, so prefill() never ran: the
                # prompt is context the draft needs whole (the skip below is for idle decode steps).
                self.prefill(seqs[b], st["draft_len"], len(seqs[b].prompt_ids) - 1, None, {})
            st["draft_fed"] = 0
            skip = max(0, len(seqs[b].tokens) - st["draft_len"] - CATCH_UP)
            st["draft_len"] += skip
            st["skipped"] += skip
            feed[b] = seqs[b].tokens[st["draft_len"]:]
        while active:
            t0 = self.now()
            slots = [seqs[b].spec_state["draft_slot"] for b in active]
            # true positions: after a skip the cache length no longer gives them
            first = [seqs[b].spec_state["draft_len"] + seqs[b].spec_state["draft_fed"] for b in active]
            logits, _, _ = self.runner.forward(slots, [feed[b] for b in active],
                                               [range(p, p + len(feed[b])) for p, b in zip(first, active)],
                                               last_only=True)
            if all(len(feed[b]) == 1 for b in active):
                self._cost.observe(len(active), self.now() - t0)
            logits = self._logits_in_target_vocab(logits)
            still = []
            for row, b in enumerate(active):
                seq, st = seqs[b], seqs[b].spec_state
                self.kv.set_length(st["draft_slot"], self.kv.lengths[st["draft_slot"]] + len(feed[b]))
                st["draft_fed"] += len(feed[b])
                if extend_chain(drafts[b], qs[b], logits[row], seq, self.spec.draft_p_min, max_tokens[b]):
                    feed[b] = drafts[b][-1:]
                    still.append(b)
            active = still
        return [DraftTree.chain(d, torch.stack(q) if q else None) for d, q in zip(drafts, qs)]

    def commit(self, seq, num_accepted):
        st = seq.spec_state
        if "draft_fed" not in st:
            return
        # The draft fed draft_len..(draft_len + draft_fed): the pending tokens, then its own drafts.
        # Those drafts that the target accepted are now sequence tokens; the first rejected one is not.
        fed_end = st["draft_len"] + st.pop("draft_fed")
        # seq.tokens[:-1] are exactly what was fed up to the first rejected draft (the newest token
        # came from the target and was never fed), so the valid prefix ends at the shorter of the two.
        valid = min(fed_end, len(seq.tokens) - 1)
        self.kv.set_length(st["draft_slot"], valid - st["skipped"])
        st["draft_len"] = valid

    def release(self, seq):
        st = seq.spec_state
        if "draft_slot" in st:
            self.kv.free(st.pop("draft_slot"))

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost(n_seqs)

    def _calibrate(self, n_seqs: int) -> float:
        """One-token forwards of the draft on the scratch slot (repeated n_seqs times as a batch)."""
        slot = self.kv.allocate()
        try:
            self.runner.forward([slot], [[0] * 32], logits=False)
            self.kv.set_length(slot, 32)
            best = float("inf")
            for _ in range(3):
                t0 = self.now()
                self.runner.forward([slot] * n_seqs, [[0]] * n_seqs, last_only=True)
                best = min(best, self.now() - t0)
            return best
        finally:
            self.kv.free(slot)
