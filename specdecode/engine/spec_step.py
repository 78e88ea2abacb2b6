"""The speculative step, top to bottom: propose → verify → accept → commit.

Plain decoding is the same step with empty drafts (one target forward over the root token)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import process_logits
from ..speculative.proposer import Proposer
from ..speculative.tree import DraftTree
from ..speculative.verify import accept
from ..runtime.model_runner import ModelRunner
from .sequence import Sequence


@dataclass
class SeqResult:
    delta: str  # newly visible text
    drafted: int  # draft depth verified (chain length; tree depth)
    accepted: int  # draft tokens accepted


@dataclass
class StepTiming:
    draft_s: float
    verify_s: float
    verify_tokens: int  # T of the verify forward (root + largest draft)


def speculative_step(runner: ModelRunner, proposer: Proposer, seqs: list[Sequence], ks: list[int],
                     now) -> tuple[list[SeqResult], StepTiming]:
    """Advances every sequence by 1 + (accepted drafts) tokens. ``ks[b]`` caps sequence b's draft."""
    kv = runner.kv
    # -- propose
    t0 = now()
    trees = proposer.propose(seqs, ks) if any(ks) else [DraftTree.empty() for _ in seqs]
    t1 = now()

    # -- verify: one target forward over (root + draft nodes) of every sequence
    starts = [kv.lengths[s.slot] for s in seqs]
    tokens = [[s.tokens[-1]] + t.tokens for s, t in zip(seqs, trees)]
    positions = [[L + d for d in [0] + t.depths()] for L, t in zip(starts, trees)]
    tree_mask = None
    if not all(t.is_chain for t in trees):
        T = max(len(x) for x in tokens)
        tree_mask = torch.zeros(len(seqs), T, T, dtype=torch.bool)
        for b, t in enumerate(trees):
            n = len(t) + 1
            tree_mask[b, :n, :n] = t.attention_mask()
    # row_exact for a single sequence: its verified tokens get the bits its plain decoding gives. A
    # batch attends together (B x T calls per layer would cost too much; batched plain decoding is
    # not bit-identical to single-sequence decoding either).
    logits, hidden, captured = runner.forward([s.slot for s in seqs], tokens, positions, tree_mask,
                                              capture_layers=proposer.capture_layers, row_exact=len(seqs) == 1)
    t2 = now()

    results = []
    for b, (seq, tree) in enumerate(zip(seqs, trees)):
        n = len(tree) + 1
        # -- accept (pure): greedy compares argmaxes, so raw logits serve as well as probabilities
        rows = logits[b, :n]
        probs = rows if seq.params.greedy else process_logits(rows, seq.params)
        res = accept(tree, probs, generator=seq.generator, greedy=seq.params.greedy)

        # -- commit: keep root + accepted path in the cache, contiguous; drop the rest by not advancing
        L = starts[b]
        kv.move(seq.slot, [L + 1 + p for p in res.path], L + 1)
        kv.set_length(seq.slot, L + 1 + len(res.path))
        kept_rows = [0] + [1 + p for p in res.path]  # rows of the verify forward now committed
        if proposer.reads_hidden:
            seq.hidden = (hidden[b, kept_rows], {i: h[b, kept_rows] for i, h in captured.items()})
        new_tokens = [tree.tokens[p] for p in res.path] + [res.token]
        # A request's first step (the drafter catching up on the prompt, the first token) is part of
        # its time to first token; the draft / verify times are those of the decode phase.
        decoding = seq.t_first_token is not None
        delta = seq.append(new_tokens)
        proposer.commit(seq, len(res.path))
        depth = max(tree.depths(), default=0)
        seq.stats.record(depth, len(res.path), (t1 - t0) * decoding, (t2 - t1) * decoding)
        results.append(SeqResult(delta, depth, len(res.path)))
    return results, StepTiming(t1 - t0, t2 - t1, max(len(x) for x in tokens))
