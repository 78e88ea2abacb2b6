"""Draft token trees. A chain is the degenerate tree (parents = [-1, 0, 1, ...]).

Node i carries ``tokens[i]``; ``parents[i]`` is its parent node (-1 = the root, i.e. the last
committed token, which is fed to the target again in the verify forward). Parents always come before
their children (parents[i] < i). ``draft_probs[i]`` [V] is the distribution tokens[i] was sampled
from (siblings sampled i.i.d. share the same row values); ``draft_probs is None`` means every token
was chosen deterministically (n-gram, argmax, top-k), i.e. a one-hot q."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None = None  # [n, V] float32, or None (deterministic draft)

    def __post_init__(self):
        assert len(self.tokens) == len(self.parents)
        assert all(-1 <= p < i for i, p in enumerate(self.parents)), "parents must precede children"

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> "DraftTree":
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), draft_probs)

    @classmethod
    def empty(cls) -> "DraftTree":
        return cls([], [])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.tokens) - 1))

    def depths(self) -> list[int]:
        """Depth of each node; the root has depth 0, its children depth 1."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in draft order (the order verification tries them)."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def attention_mask(self) -> torch.Tensor:
        """[n+1, n+1] bool over (root, node 0..n-1): True where row may attend column
        (itself, its ancestors, and the root)."""
        n = len(self.tokens)
        m = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        m[:, 0] = True
        for i, p in enumerate(self.parents):
            m[i + 1] = m[p + 1] if p >= 0 else m[0]
            m[i + 1, i + 1] = True
        return m
