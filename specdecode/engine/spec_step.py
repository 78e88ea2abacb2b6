"""The speculative step, top to bottom: propose → verify → accept → commit.

Plain decoding is the same step with empty drafts (one target forward over the root token)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..runtime.model_runner import ModelRunner
from ..sampling import COIN, TARGET, apply_penalties, argmax_rows, process_logits, token_logprobs
from ..speculative.proposer import Proposer
from ..speculative.tree import DraftTree
from ..speculative.verify import accept_batch, greedy_paths
from .sequence import Sequence


@dataclass
class SeqResult:
    delta: str  # newly visible text
    drafted: int  # draft depth verified (chain length; tree depth)
    accepted: int  # draft tokens accepted


@dataclass
class StepTiming:
    propose_s: float
    verify_s: float
    verify_rows: int  # rows the verify forward computed: sum of (root + draft) when it ran packed, else B x T
    # per prompt chunk fed in the verify forward: (hidden [n, H], captured {layer: [n, H]}) of its rows
    prefilled: list[tuple[torch.Tensor, dict[int, torch.Tensor]]]


def speculative_step(runner: ModelRunner, proposer: Proposer, seqs: list[Sequence], ks: list[int],
                     now: Callable[[], float], prefills: list[tuple[Sequence, list[int]]] = ()
                     ) -> tuple[list[SeqResult], StepTiming]:
    """Advances every sequence by 1 + (accepted drafts) tokens. ``ks[b]`` caps sequence b's draft.
    ``prefills``: (sequence, prompt tokens after its cached ones) chunks that ride in the verify forward
    (their KV is written past the committed length, which the caller then advances); they get no logits."""
    kv = runner.kv
    # -- propose
    t0 = now()
    trees = proposer.propose(seqs, ks) if any(ks) else [DraftTree.empty() for _ in seqs]
    t1 = now()

    # -- verify: one target forward over (root + draft nodes) of every sequence
    starts = [kv.lengths[s.slot] for s in seqs]
    tokens = [[s.tokens[-1]] + t.tokens for s, t in zip(seqs, trees)]
    positions = [[L + d for d in [0] + t.depths()] for L, t in zip(starts, trees)]
    B = len(seqs)
    for s, chunk in prefills:  # a prompt chunk: consecutive positions after what the cache holds
        L = kv.lengths[s.slot]
        tokens.append(chunk)
        positions.append(list(range(L, L + len(chunk))))
    T = max(len(x) for x in tokens)
    tree_mask = None
    if not all(t.is_chain for t in trees):
        tree_mask = torch.zeros(len(tokens), T, T, dtype=torch.bool)
        for b, t in enumerate(trees):
            tree_mask[b, :len(t) + 1, :len(t) + 1] = t.attention_mask()
        for b, (_, chunk) in enumerate(prefills, B):
            tree_mask[b, :len(chunk), :len(chunk)] = torch.ones(len(chunk), len(chunk), dtype=torch.bool).tril()
    # On the cpu-native backend every verify row already gets the bits its plain decoding gives. On
    # torch-sdpa, row_exact buys that for a single sequence (query by query); a batch attends
    # together there (B x T calls per layer would cost too much).
    logits, hidden, captured = runner.forward([s.slot for s in seqs] + [s.slot for s, _ in prefills], tokens,
                                              positions, tree_mask, capture_layers=proposer.capture_layers,
                                              row_exact=len(tokens) == 1, packed_logits=True,
                                              logits_for=B)  # [sum of len(tokens[b]) for b < B, V]
    t2 = now()
    prefilled = [(hidden[b, :len(chunk)], {i: h[b, :len(chunk)] for i, h in captured.items()})
                 for b, (_, chunk) in enumerate(prefills, B)]

    # -- accept (pure): every tree in one call; paths reach the host in one transfer
    path_of, token_of = accept_trees(trees, logits, seqs)

    results = []
    first = 0  # sequence b's first row in logits
    for b, (seq, tree) in enumerate(zip(seqs, trees)):
        path = path_of[b]
        # -- commit: keep root + accepted path in the cache, contiguous; drop the rest by not advancing
        L = starts[b]
        kv.move(seq.slot, [L + 1 + p for p in path], L + 1)
        kv.set_length(seq.slot, L + 1 + len(path))
        kept = None
        if proposer.reads_hidden:
            rows = [0] + [1 + p for p in path]  # rows of the verify forward now committed, ascending
            if rows[-1] == len(rows) - 1:  # a chain's path (or none): a view, not a gather (~5x cheaper)
                rows = slice(0, len(rows))
            kept = (hidden[b, rows], {i: h[b, rows] for i, h in captured.items()})
        # A request's first step (the drafter catching up on the prompt, the first token) is part of
        # its time to first token; the draft / verify times are those of the decode phase.
        decoding = seq.t_first_token is not None
        emitted = [tree.tokens[p] for p in path] + [token_of[b]]
        lps = None
        if seq.params.logprobs is not None:  # emitted[i] was predicted by row ([0] + [1 + p for p in path])[i]
            lps = token_logprobs(logits[[first] + [first + 1 + p for p in path]], emitted, seq.params.logprobs)
        first += len(tree) + 1
        delta = seq.append(emitted, lps)
        proposer.commit(seq, len(path), kept)
        depth = max(tree.depths(), default=0)
        seq.stats.record(depth, len(path), (t1 - t0) * decoding, (t2 - t1) * decoding, proposer.drafted_by(seq))
        results.append(SeqResult(delta, depth, len(path)))
    return results, StepTiming(t1 - t0, t2 - t1, runner.last_rows, prefilled)


def accept_trees(trees: list[DraftTree], logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[list[int]], list[int]]:
    """The acceptance rule for the whole batch: logits [N, V] of the verify forward, packed: sequence
    b's len(trees[b]) + 1 rows (the root's, then node i's at 1 + i) follow sequence b - 1's. Returns
    each sequence's accepted path (node indices, root-to-leaf) and its next token. Greedy requests
    compare argmaxes of the logits (penalized where the request sets a penalty); a batch with sampled
    requests processes every row with its request's settings (a greedy row becomes one-hot, on which
    the sampling rules decide exactly as the greedy one). A sampled request's random numbers come
    from its own RandomStream, by output position: what a batch-mate or an earlier draft did never
    changes them."""
    rows = logits
    sizes = [len(t) + 1 for t in trees]
    params = [s.params for s, k in zip(seqs, sizes) for _ in range(k)]
    if any(s.params.penalized for s in seqs):
        # a penalty makes each row's distribution depend on the tokens before it, draft tokens included:
        # the root's row follows the committed output, node i's also node i's path
        outputs = [s.output_ids + path for s, t in zip(seqs, trees) for path in [[]] + t.paths()]
        rows = apply_penalties(rows, params, [s.prompt_ids for s, k in zip(seqs, sizes) for _ in range(k)], outputs)
    if all(s.params.greedy for s in seqs):  # argmaxes of the (penalized) logits decide
        return greedy_paths([t.tokens for t in trees], [t.parents for t in trees], argmax_rows(rows).tolist())
    B, n = len(trees), max(len(t) for t in trees)
    tok = torch.zeros(B, n, dtype=torch.long)
    par = torch.full((B, n), -2, dtype=torch.long)  # < -1: padding, never tried
    for b, t in enumerate(trees):
        tok[b, :len(t)] = torch.tensor(t.tokens, dtype=torch.long)
        par[b, :len(t)] = torch.tensor(t.parents, dtype=torch.long)
    # index [B, n + 1]: each (sequence, node row)'s row of logits; a padding node takes its root's row,
    # which the walks never read for it (padding is never tried)
    index, first = torch.zeros(B, n + 1, dtype=torch.long), 0
    for b, k in enumerate(sizes):
        index[b, :k] = torch.arange(first, first + k)
        index[b, k:] = first
        first += k
    probs = process_logits(rows, params)  # [N, V]
    # trees of one size lay their rows out as [B, n + 1] already: a view, not a copy of every row
    probs = probs.view(B, n + 1, -1) if len(set(sizes)) == 1 else probs[index.to(probs.device)]
    _, token, accepted = _accept_sampled(trees, seqs, tok, par, probs)
    accepted, token = accepted.cpu(), token.tolist()
    return [accepted[b, :len(t)].nonzero().flatten().tolist() for b, t in enumerate(trees)], token


def _accept_sampled(trees: list[DraftTree], seqs: list[Sequence], tok: torch.Tensor, par: torch.Tensor,
                    probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """accept_batch's sampling rules on the processed rows probs [B, n + 1, V], with each request's
    per-position random numbers."""
    B, n = tok.shape
    draft = None
    if any(t.draft_probs is not None for t in trees):  # zero rows: deterministic nodes (accept_batch)
        draft = probs.new_zeros(B, n, probs.shape[-1])
        for b, t in enumerate(trees):
            if t.draft_probs is not None:
                draft[b, :len(t)] = t.draft_probs.to(draft)
    depth = max((max(t.depths(), default=0) for t in trees), default=0)
    u_target, u_coin = torch.zeros(B, depth + 1), torch.zeros(B, n)
    for b, (s, t) in enumerate(zip(seqs, trees)):
        if s.random is not None:
            pos = len(s.tokens)  # index the token after the root takes in s.tokens
            u_target[b] = s.random.u(range(pos, pos + depth + 1), TARGET)
            if t.draft_probs is not None and len(t):
                u_coin[b, :len(t)] = s.random.u([pos + d - 1 for d in t.depths()], [COIN + i for i in range(len(t))])
    return accept_batch(tok.to(probs.device), par, probs, draft, greedy=False, u_target=u_target, u_coin=u_coin)
