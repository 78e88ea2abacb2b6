"""A separate small draft model with its own KV cache, kept in step with the target's.

State per sequence (``seq.draft_state``, a _State): ``slot`` in the draft's cache; ``length`` = leading
tokens of seq.tokens the draft has passed, ``skipped`` = how many of them it skipped (below): its cache
holds the other length - skipped, each at its true position. A proposal feeds the pending tokens
tokens[length:] (at least the root) and then its own drafts one at a time; ``commit`` keeps what
the target accepted, which the draft had fed, and rolls the rest back by not advancing.

Catch-up: while the controller chooses k = 0 the draft is idle and falls behind; feeding everything
it missed when drafting resumes would cost a forward over all of it (measured on Spec-Bench RAG:
57 ms per resumed step against 21 ms per draft token, which made the re-probes of a text the draft
predicts badly cost 6 % of decode time). It feeds only the last CATCH_UP tokens and skips the rest:
the draft then attends its older context and those tokens, with a hole between, which may lower its
acceptance but never the output's correctness (the target verifies every draft).

A finished request's state is kept for its target slot's next request (speculative/kept.py): after
a prefix-cache hit the draft keeps its entries of the shared tokens (up to its first skip) and
prefills only the rest; a slot's tokens that move to the host prompt store take a copy of those entries
along (``stash``), which a hit from the store resumes alike. A prompt that shares a running request's
prefix (``share``) copies that request's entries of it the same way.

Draft vocabulary (``--draft-vocab auto``): when the target has an EAGLE-3 head (``--spec-head`` or
bundled), the draft's LM head keeps only the rows of that head's draft vocabulary, the target's most
frequent tokens. A 0.5B Qwen's LM head is 38 % of its step's bytes; 8192 of 151936 rows are 2 %.
The draft then never proposes a token outside it (q = 0 there), which costs acceptance only where
the target emits one; verification keeps the output exact either way. Its logits stay in that
vocabulary (a greedy draft maps its argmax to the target's id; only a sampled draft's q is written
out over the target's vocabulary)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import SpecConfig
from ..errors import SpecDecodeError
from ..runtime.kv_cache import KVCache
from ..runtime.model_runner import ModelRunner
from ..runtime.target import Target
from .controller import DraftCost
from .kept import KeptStates
from .proposer import Proposer, Stash, extend_chain
from .tree import DraftTree

CATCH_UP = 4  # most pending tokens fed when drafting resumes (~1.4x a one-token draft forward)


def check_vocab_compatible(target_tok, draft_tok) -> None:
    """The draft must speak the target's token ids. A padded embedding table (extra unused rows) is
    harmless and allowed; a different tokenizer is refused."""
    if target_tok.vocab_size != draft_tok.vocab_size or any(
            target_tok.id_to_piece(i) != draft_tok.id_to_piece(i) for i in range(target_tok.vocab_size)):
        raise SpecDecodeError(f"the draft model's vocabulary ({draft_tok.vocab_size} tokens) does not match "
                              f"the target's ({target_tok.vocab_size} tokens): use a draft with the same tokenizer")


@dataclass
class _State:
    slot: int  # the sequence's slot in the draft's KV cache
    length: int = 0  # leading tokens of seq.tokens the draft has passed (fed or skipped)
    skipped: int = 0  # of those, skipped by catch-ups: the cache holds length - skipped entries
    fed: int | None = None  # tokens fed by the current proposal (pending tokens, then drafts); None = none
    drafts: list[int] = field(default_factory=list)  # the current proposal's drafts, from position drafted_at
    drafted_at: int = 0
    exact: int = 1 << 62  # cache entries before the first skip: entry i is position i below this


class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, spec: SpecConfig, target: Target, model=None, tokenizer=None):
        from ..loader import load_checkpoint, weight_quant
        from ..store import resolve_model

        if model is None:
            model, tokenizer = load_checkpoint(resolve_model(spec.model_draft), target.dtype, target.device,
                                               weight_quant(spec.quant_draft, target.device), target.weight_cache)
        check_vocab_compatible(target.tokenizer, tokenizer)
        self.spec, self.model = spec, model
        self.target_vocab = target.model.cfg.vocab_size
        mc = model.cfg
        # one slot per target slot plus a scratch slot for cost calibration
        self.kv = KVCache(mc.num_layers, target.kv.num_slots + 1, target.kv.max_len, mc.num_kv_heads,
                          mc.head_dim, target.kv_dtype(model.quant), target.device)
        self.runner = ModelRunner(model, self.kv, target.attention)
        self.vocab = head_vocabulary(spec, target) if spec.draft_vocab == "auto" else None  # [Vr] ids or None
        if self.vocab is not None:
            self.vocab = self.vocab.to(target.device)  # entry j of a logits row is token vocab[j]
        self.lm_head = None if self.vocab is None else reduced_head(model, self.vocab)
        self.timer = target.timer
        self._cost = DraftCost(self._calibrate)
        self._kept = KeptStates(lambda st: self.kv.free(st.slot))

    def _last_logits(self, slots, feed, positions) -> torch.Tensor:
        """The draft forward over ``feed``; float32 logits of each row's last token: [B, Vr] over the ids
        ``vocab`` where the LM head is reduced, else [B, V_target]."""
        if self.lm_head is None:
            logits, _, _ = self.runner.forward(slots, feed, positions, last_only=True)
            return self._logits_in_target_vocab(logits)
        _, hidden, _ = self.runner.forward(slots, feed, positions, logits=False)
        rows = torch.arange(len(feed), device=hidden.device)
        last = hidden[rows, torch.tensor([len(f) - 1 for f in feed], device=hidden.device)]  # [B, H]
        return self.lm_head(last).float()

    def _logits_in_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[B, V_draft] -> [B, V_target]: drop padded rows, or pad with -inf (q = 0 there)."""
        V = self.target_vocab
        if logits.shape[-1] >= V:
            return logits[..., :V]
        pad = logits.new_full((*logits.shape[:-1], V - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    def _state(self, seq) -> _State:
        if seq.draft_state is None:
            kept = self._kept.take(seq)
            if kept is None:
                seq.draft_state = _State(self.kv.allocate())
            else:  # the previous request's entries of the tokens both share, up to its first skip
                seq.draft_state = _State(kept.slot, min(kept.length, seq.num_cached, kept.exact))
                self.kv.set_length(kept.slot, seq.draft_state.length)
        return seq.draft_state

    def prefill(self, seq, start, end, hidden=None):
        st = self._state(seq)
        if end > st.length:
            self.runner.forward([st.slot], [seq.prompt_ids[st.length:end]], [range(st.length, end)], logits=False)
            self.kv.set_length(st.slot, end - st.skipped)
            st.length = end

    def share(self, seq, donor, n):
        """A copy of the donor's entries of the n shared tokens, as far as they hold exact positions (up
        to its first skip), so the draft prefills only the rest of the prompt. The target shares all n
        either way: the draft feeds its missing tokens itself (``prefill``, ``propose``)."""
        src = donor.draft_state
        if seq.draft_state is not None or seq.num_cached or src is None:
            return n
        have = min(n, src.exact, self.kv.lengths[src.slot])
        self._kept.take(seq)  # frees the state kept under seq's slot, whose tokens seq does not reuse
        seq.draft_state = _State(self.kv.allocate(), have)
        if have:
            self.kv.copy_prefix(src.slot, seq.draft_state.slot, have)
        self.kv.set_length(seq.draft_state.slot, have)
        return n

    def propose(self, seqs, max_tokens):
        drafts = [[] for _ in seqs]
        qs: list[list[torch.Tensor]] = [[] for _ in seqs]
        active = [b for b, k in enumerate(max_tokens) if k > 0]
        feed = {}
        for b in active:
            seq = seqs[b]
            st = self._state(seq)
            if st.length < len(seq.prompt_ids) - 1:
                # The target took this prompt from its prefix cache, so prefill() never ran: the
                # prompt is context the draft needs whole (the skip below is for idle decode steps).
                self.prefill(seq, st.length, len(seq.prompt_ids) - 1)
            st.fed = 0
            skip = max(0, len(seq.tokens) - st.length - CATCH_UP)
            if skip and not st.skipped:
                st.exact = st.length
            st.length += skip
            st.skipped += skip
            feed[b] = seq.tokens[st.length:]
        while active:
            t0 = self.timer.now()
            states = [seqs[b].draft_state for b in active]
            # true positions: after a skip the cache length no longer gives them
            first = [st.length + st.fed for st in states]
            logits = self._last_logits([st.slot for st in states], [feed[b] for b in active],
                                        [range(p, p + len(feed[b])) for p, b in zip(first, active)])
            if all(len(feed[b]) == 1 for b in active):
                self._cost.observe(len(active), self.timer.now() - t0)
            still = []
            for row, (b, st) in enumerate(zip(active, states)):
                self.kv.set_length(st.slot, self.kv.lengths[st.slot] + len(feed[b]))
                st.fed += len(feed[b])
                if extend_chain(drafts[b], qs[b], logits[row], seqs[b], self.spec.draft_p_min, max_tokens[b],
                                self.vocab, self.target_vocab):
                    feed[b] = drafts[b][-1:]
                    still.append(b)
            active = still
        for b in range(len(seqs)):
            if max_tokens[b] > 0:
                seqs[b].draft_state.drafts, seqs[b].draft_state.drafted_at = drafts[b], len(seqs[b].tokens)
        return [DraftTree.chain(d, torch.stack(q) if q else None) for d, q in zip(drafts, qs)]

    def commit(self, seq, num_accepted, hidden=None):
        st = seq.draft_state
        if st is None or st.fed is None:
            return
        # The draft fed length..(length + fed): the pending tokens, then its own drafts. Its entries
        # stay valid up to its first draft that the sequence does not hold (rejected, or another
        # chain member's token accepted there instead), and never past seq.tokens[:-1] (the newest
        # token came from the target and was never fed).
        fed_end, st.fed = st.length + st.fed, None
        held = 0
        while (held < len(st.drafts) and st.drafted_at + held < len(seq.tokens)
               and seq.tokens[st.drafted_at + held] == st.drafts[held]):
            held += 1
        valid = min(fed_end, len(seq.tokens) - 1, st.drafted_at + held)
        self.kv.set_length(st.slot, valid - st.skipped)
        st.length = valid

    def release(self, seq):
        self._kept.keep(seq, seq.draft_state)
        seq.draft_state = None

    def stash(self, slot):
        """A host copy of the entries the state kept under target slot ``slot`` holds at their true
        positions (up to its first skip): k, v [layers, Hkv, n, D]."""
        st = self._kept.peek(slot)
        n = 0 if st is None else min(st.length, st.exact, self.kv.lengths[st.slot])
        if n == 0:
            return None
        k, v = self.kv.read(st.slot, n)
        return Stash((k, v), k.nbytes + v.nbytes)

    def unstash(self, seq, stash):
        """The stashed entries of the positions the store hit covers, in a fresh slot: the draft then
        prefills only the rest of the prompt, as after a slot's hit."""
        k, v = stash.state
        st = self._state(seq)  # fresh: a store hit reuses none of the tokens the slot kept
        n = min(k.shape[2], seq.num_prefilled)
        self.kv.load(st.slot, k[:, :, :n], v[:, :, :n])
        self.kv.set_length(st.slot, n)
        st.length = n

    @property
    def max_tokens(self) -> int:
        return self.spec.draft_max

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost(n_seqs)

    def _calibrate(self, n_seqs: int) -> float:
        """One-token forwards of the draft on a scratch slot (repeated n_seqs times as a batch)."""
        with self.kv.scratch_slot() as slot:
            self.runner.forward([slot], [[0] * 32], logits=False)
            self.kv.set_length(slot, 32)
            return self.timer.best_of(lambda: self._last_logits([slot] * n_seqs, [[0]] * n_seqs, None))


def head_vocabulary(spec: SpecConfig, target: Target) -> torch.Tensor | None:
    """Sorted target ids of the EAGLE-3 head the target has (--spec-head, else the bundled one): id
    + d2t[id] for each draft id; None when there is no such head or it keeps the whole vocabulary."""
    from pathlib import Path

    from safetensors import safe_open

    from ..heads import find_head, head_fits

    try:
        path = Path(spec.head).expanduser() if spec.head else find_head(target.name, "eagle3")
        if not spec.head and not head_fits(path, target.model.cfg):
            return None
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            d2t = f.get_tensor("d2t").long()
    except Exception:  # no head, or one without a reduced vocabulary: keep the full LM head
        return None
    ids = (torch.arange(len(d2t)) + d2t).sort().values
    V = target.model.cfg.vocab_size
    if len(ids) >= V or ids.max() >= V or ids.min() < 0:
        return None
    return ids


def reduced_head(model, ids: torch.Tensor) -> torch.nn.Module:
    """An LM head [len(ids), H] of the model's own rows for ``ids``, in the format the model's head
    runs in (int8 rows stay int8 with their scales: the logits of those ids are unchanged)."""
    from ..layers.quant import Int8Linear

    rows = model.head_rows(ids.to(model.device))
    if model.lm_head is not None and hasattr(model.lm_head, "int8_rows"):
        return Int8Linear.from_float(rows)
    lin = torch.nn.Linear(rows.shape[1], rows.shape[0], bias=False, device=model.device, dtype=model.dtype)
    with torch.no_grad():
        lin.weight.copy_(rows)
    return lin.requires_grad_(False)
