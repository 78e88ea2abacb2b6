"""Runs a model forward over a batch of sequences held in a KV cache.

One code path for prefill, single-token decode and multi-token (tree) verification. The runner never
changes committed lengths on its own: callers commit with ``kv.set_length`` after acceptance, which
is how rejected draft tokens are rolled back for free."""
from __future__ import annotations

import torch

from .context import Context, use_context
from .kv_cache import KVCache


class ModelRunner:
    def __init__(self, model, kv: KVCache, attention=None):
        """attention: the AttentionBackend (runtime/attention) its forwards run on; None = the default."""
        self.model, self.kv, self.attention = model, kv, attention
        # the rows the last forward's layers computed: sum of num_new where a ragged batch ran packed,
        # else B x T (the verify cost the controller's cost model observes)
        self.last_rows = 0

    @property
    def device(self) -> torch.device:
        return self.model.device

    @torch.inference_mode()
    def forward(self, slots: list[int], tokens: list[list[int]], positions: list[list[int]] | None = None,
                tree_mask: torch.Tensor | None = None, logits: bool = True, last_only: bool = False,
                capture_layers: tuple[int, ...] = (), row_exact: bool = False, packed_logits: bool = False,
                logits_for: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """Feeds ``tokens[b]`` to sequence ``slots[b]`` after its committed tokens.

        positions[b] default to consecutive positions after the committed length (a chain); a tree
        passes its node depths plus the committed length and a tree_mask [B, T, T].
        Returns (logits, hidden, captured): logits [B, T, V] float32 ([B, V] with last_only, the last
        *real* token of each row; None with logits=False), hidden [B, T, H] final normed hidden states,
        captured {layer: [B, T, H]}. Padding (row b's positions from num_new[b] on) is zero in all of them.
        row_exact: attend query by query (runtime/context.py), for verify forwards.
        packed_logits: logits of the real rows only, [N, V] in (b, t) order (N = the number of tokens
        fed): a ragged batch's logits are not copied into a zero-padded [B, T, V], a copy of several
        MB that costs a batched verify more than a row of its GEMMs. logits_for: with packed_logits, only
        the first ``logits_for`` sequences' rows get logits (the rest ride along for their KV and hidden
        states: prompt chunks in a verify forward).
        Does not commit: the new tokens sit in the cache beyond ``kv.lengths[slot]``."""
        B = len(slots)
        num_new = [len(t) for t in tokens]
        T = max(num_new)
        starts = [self.kv.lengths[s] for s in slots]
        for s, n in zip(slots, num_new):
            self.kv.check_fits(s, n)
        if B == 1 and logits_for != 0:
            out = self._lean(slots[0], tokens[0], [int(p) for p in positions[0]] if positions is not None else
                             list(range(starts[0], starts[0] + T)), None if tree_mask is None else tree_mask[0],
                             tuple(capture_layers), logits, last_only, packed_logits)
            if out is not None:
                return out
        ids = torch.zeros(B, T, dtype=torch.long)
        pos = torch.zeros(B, T, dtype=torch.long)
        for b in range(B):
            ids[b, :num_new[b]] = torch.tensor(tokens[b], dtype=torch.long)
            p = positions[b] if positions is not None else range(starts[b], starts[b] + num_new[b])
            pos[b, :num_new[b]] = torch.as_tensor(list(p), dtype=torch.long)
        ids, pos = ids.to(self.device), pos.to(self.device)
        ctx = Context(self.kv, list(slots), starts, num_new, tree_mask, tuple(capture_layers), row_exact=row_exact,
                      backend=self.attention)
        with use_context(ctx, self.device):
            hidden = self.model(ids, pos)
        self.last_rows = sum(num_new) if ctx.packed else B * T
        real = None  # [B, T] bool: the rows that are not padding, where some are
        if min(num_new) < T:
            real = torch.zeros(B, T, dtype=torch.bool)
            for b, n in enumerate(num_new):
                real[b, :n] = True
            real = real.to(self.device)
            if not ctx.packed:  # one contract on every path: the packed one unpacks into zeros already
                for h in (hidden, *ctx.captured.values()):
                    h[~real] = 0
        if not logits:
            return None, hidden, ctx.captured
        if packed_logits:
            if logits_for is not None and logits_for < B:
                real = (real if real is not None else torch.ones(B, T, dtype=torch.bool, device=self.device)).clone()
                real[logits_for:] = False
            return self.model.compute_logits(hidden[real] if real is not None else hidden.flatten(0, 1)), \
                hidden, ctx.captured
        if last_only:
            last = torch.tensor([n - 1 for n in num_new], device=self.device)
            return self.model.compute_logits(hidden[torch.arange(B, device=self.device), last]), hidden, ctx.captured
        if real is not None:  # ragged: the LM head multiplies the real rows only
            rows = self.model.compute_logits(hidden[real])  # [N, V]
            out = rows.new_empty(B, T, rows.shape[-1])
            out[real] = rows
            out[~real] = 0
            return out, hidden, ctx.captured
        return self.model.compute_logits(hidden), hidden, ctx.captured

    def _lean(self, slot: int, tokens: list[int], positions: list[int], tree_mask: torch.Tensor | None,
              capture: tuple[int, ...], logits: bool, last_only: bool, packed: bool):
        """forward's result for a few tokens of one sequence through the model's lean path (a decode
        step, a short verify), or None where the model has none for this forward."""
        few = getattr(self.model, "few_tokens", None)
        out = None if few is None else few(self.kv, self.attention, slot, tokens, positions, tree_mask, capture)
        if out is None:
            return None
        hidden, captured = out  # [1, T, H]
        T = hidden.shape[1]
        self.last_rows = T
        if not logits:
            return None, hidden, captured
        if last_only:
            return self.model.compute_logits(hidden[:, -1]), hidden, captured  # [1, V]
        rows = self.model.compute_logits(hidden.view(T, -1))  # [T, V]
        return (rows if packed else rows.view(1, T, -1)), hidden, captured
