"""A greedy step's accept: the walk over tensors that accept_trees ran before (a copy of it below, on
verify.greedy_walk) against accept_trees now (verify.greedy_paths on host lists), for B sequences with
chains of k drafts over the 1.5B's vocabulary, warm and right after a 256 MiB float32 sum has streamed
through the caches (as a decode step's weights do before its accept runs). Checks both give the same
paths and tokens.

    python scripts/ab_accept_greedy.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdecode.engine.spec_step import accept_trees  # noqa: E402
from specdecode.sampling import argmax_rows  # noqa: E402
from specdecode.sampling_params import SamplingParams  # noqa: E402
from specdecode.speculative.tree import DraftTree  # noqa: E402
from specdecode.speculative.verify import greedy_walk  # noqa: E402
from bench_step_parts import median_us  # noqa: E402


def tensor_walk(trees: list[DraftTree], logits: torch.Tensor, seqs) -> tuple[list[list[int]], list[int]]:
    """accept_trees' greedy branch as it was (no penalties): node tensors, the row index, greedy_walk."""
    B, n = len(trees), max(len(t) for t in trees)
    tok = torch.zeros(B, n, dtype=torch.long)
    par = torch.full((B, n), -2, dtype=torch.long)
    for b, t in enumerate(trees):
        tok[b, :len(t)] = torch.tensor(t.tokens, dtype=torch.long)
        par[b, :len(t)] = torch.tensor(t.parents, dtype=torch.long)
    index, first = torch.zeros(B, n + 1, dtype=torch.long), 0
    for b, k in enumerate(len(t) + 1 for t in trees):
        index[b, :k] = torch.arange(first, first + k)
        index[b, k:] = first
        first += k
    _, token, accepted = greedy_walk(tok, par, argmax_rows(logits)[index])
    accepted, token = accepted.cpu(), token.tolist()
    return [accepted[b, :len(t)].nonzero().flatten().tolist() for b, t in enumerate(trees)], token


class _Seq:  # what accept_trees reads of a sequence on the greedy path
    params = SamplingParams(temperature=0)


def main() -> int:
    torch.set_num_threads(2)
    stream = torch.ones(64 << 20)  # 256 MiB
    for B, k in ((1, 0), (1, 3), (8, 0), (8, 3)):
        trees = [DraftTree.chain(list(range(k))) for _ in range(B)]
        logits = torch.randn(B * (k + 1), 151936)
        seqs = [_Seq() for _ in range(B)]
        assert tensor_walk(trees, logits, seqs) == accept_trees(trees, logits, seqs)
        ms = [median_us(lambda: f(trees, logits, seqs), before, reps=40) / 1e3 for f in (tensor_walk, accept_trees)
              for before in (None, stream.sum)]
        print(f"B={B} k={k}: before {ms[0]:.3f} / {ms[1]:.3f} ms (warm / after the stream), "
              f"now {ms[2]:.3f} / {ms[3]:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
