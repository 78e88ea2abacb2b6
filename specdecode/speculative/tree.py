"""Draft token trees. A chain is the degenerate tree (parents = [-1, 0, 1, ...]).

Node i carries ``tokens[i]``; ``parents[i]`` is its parent node (-1 = the root, i.e. the last
committed token, which is fed to the target again in the verify forward). Parents always come before
their children (parents[i] < i). ``draft_probs[i]`` [V] is the distribution tokens[i] was sampled
from (siblings sampled i.i.d. share the same row values); ``draft_probs is None`` means every token
was chosen deterministically (n-gram, argmax, top-k), i.e. a one-hot q. ``evidence``: a draftless drafter's
class of what the draft rests on (suffix: how long a context match, how frequent its first branch), 0 when it
gives none; a chain keeps an acceptance record per class (speculative/chain.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None = None  # [n, V] float32, or None (deterministic draft)
    evidence: int = 0

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

    def paths(self) -> list[list[int]]:
        """Each node's tokens from the root's first child down to the node itself."""
        out: list[list[int]] = []
        for t, p in zip(self.tokens, self.parents):
            out.append((out[p] if p >= 0 else []) + [t])
        return out

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (-1 = root), in draft order (the order verification tries them)."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def match(self, tokens: list[int]) -> int:
        """How many leading ``tokens`` a root path of the tree carries (the draft tokens it would have
        had accepted, had the target emitted ``tokens``)."""
        node, n = -1, 0
        for t in tokens:
            nxt = [i for i in self.children(node) if self.tokens[i] == t]
            if not nxt:
                break
            node, n = nxt[0], n + 1
        return n

    def union(self, other: "DraftTree", limit: int) -> tuple["DraftTree", int]:
        """This deterministic tree with ``other``'s leading nodes merged in as a trie (a node of other
        whose parent is in the union and whose token a child of that parent already carries is that
        child), at most ``limit`` nodes in all. Returns (the union, how many leading nodes of other it
        holds: other's first j nodes, closed under ancestors as every prefix of a tree is). Siblings
        keep distinct tokens when both trees' siblings do, so exact-match verification walks it as
        either tree."""
        assert self.draft_probs is None and other.draft_probs is None, "only deterministic drafts merge"
        tokens, parents = list(self.tokens), list(self.parents)
        child = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
        where: list[int] = []  # other's node j -> its node in the union
        for t, p in zip(other.tokens, other.parents):
            up = -1 if p < 0 else where[p]
            node = child.get((up, t))
            if node is None:
                if len(tokens) >= limit:
                    break
                node = child[(up, t)] = len(tokens)
                tokens.append(t)
                parents.append(up)
            where.append(node)
        return DraftTree(tokens, parents), len(where)

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
