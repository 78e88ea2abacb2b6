"""--spec-type suffix: suffix-tree speculation (SuffixDecoding, Oliaro et al., arXiv 2411.04975), as
vLLM's ``suffix`` method runs it, on Snowflake's C++ suffix trees (``arctic_inference``).

One cache for the engine holds a suffix tree per active request (its prompt and output so far) and
a global tree of the outputs of recent finished requests. A proposal matches the last tokens of the
request against both and returns a tree of likely continuations; its size follows the match:
at most ``max_spec_factor`` x the matched length (vLLM's adaptive speculation length), only
branches whose empirical probability reaches ``min_token_prob``. Deterministic drafts. A request's
tree takes its new tokens only when it is read (a proposal) or closed (release): in a full batch, where
drafting does not pay and nothing is proposed for steps on end, a commit costs nothing.

arctic_inference is installed by install.sh (its sdist builds on any CPU with a C++20 compiler;
see the README); without it, --spec-type suffix is a clear error and ``auto`` leaves it out."""
from __future__ import annotations

import itertools
import time

from ..config import SpecConfig
from ..errors import InvalidRequestError
from .controller import ema
from .proposer import Proposer
from .tree import DraftTree


def available() -> bool:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return False
    return True


class SuffixProposer(Proposer):
    name = "suffix"
    draftless = True

    def __init__(self, spec: SpecConfig):
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise InvalidRequestError("--spec-type suffix needs the arctic-inference package: run ./install.sh "
                                      "(it builds it for this machine)") from None
        self.spec = spec
        self.cache = SuffixDecodingCache(max_tree_depth=spec.suffix_max_tree_depth,
                                         max_cached_requests=spec.suffix_max_cached_requests)
        self._ids = itertools.count()
        self._cost = 0.0

    @property
    def max_tokens(self) -> int:
        return self.spec.suffix_max_tree_depth  # vLLM's default number of speculative tokens for suffix

    def _start(self, seq) -> int:
        """The request's id in the cache, starting it (prompt + output so far) on first use."""
        if seq.draft_state is None:
            seq.draft_state = [next(self._ids), len(seq.tokens)]  # [request id, tokens the cache has]
            self.cache.start_request(seq.draft_state[0], seq.prompt_ids)
            if len(seq.tokens) > len(seq.prompt_ids):
                self.cache.add_active_response(seq.draft_state[0], seq.tokens[len(seq.prompt_ids):])
        return seq.draft_state[0]

    def _sync(self, seq) -> int:
        rid = self._start(seq)
        have = seq.draft_state[1]
        if have < len(seq.tokens):
            self.cache.add_active_response(rid, seq.tokens[have:])
            seq.draft_state[1] = len(seq.tokens)
        return rid

    def prefill(self, seq, start, end, hidden=None):
        self._start(seq)

    def propose(self, seqs, max_tokens):
        t0 = time.perf_counter()
        trees = []
        depth = self.spec.suffix_max_tree_depth
        for seq, k in zip(seqs, max_tokens):
            if k <= 0:
                trees.append(DraftTree.empty())
                continue
            rid = self._sync(seq)
            d = self.cache.speculate(rid, seq.tokens[-depth:], max_spec_tokens=k,
                                     max_spec_factor=self.spec.suffix_max_spec_factor,
                                     min_token_prob=self.spec.suffix_min_token_prob, use_tree_spec=True)
            tree = _tree(list(d.token_ids), list(d.parents), k)
            if len(tree):
                tree.evidence = evidence(d.match_len, d.probs[0])
            trees.append(tree)
        self._cost = ema(self._cost, (time.perf_counter() - t0) / max(1, sum(max_tokens)))
        return trees

    def commit(self, seq, num_accepted, hidden=None):
        pass  # the request's tree learns its new tokens when it is next read (propose) or closed (release)

    def release(self, seq):
        if seq.draft_state is not None:
            self._sync(seq)
            self.cache.stop_request(seq.draft_state[0])  # its output joins the global tree
        seq.draft_state = None

    def draft_cost(self, n_seqs: int = 1) -> float:
        return self._cost * n_seqs

    def evidence_prior(self, evidence: int) -> tuple[float, ...]:
        return EVIDENCE_PRIOR.get(evidence, ())


# Measured acceptance per draft position (given the earlier ones right) of each evidence class:
# scripts/suffix_class_priors.py over the target's greedy answers to 160 head-training prompts (never a
# benchmark's), Qwen2.5-Coder-1.5B-Instruct, 14.7k drafts (docs/benchmarks.md, round 32). A chain's
# record of a class starts here (Proposer.evidence_prior); its own drafts then move it.
EVIDENCE_PRIOR = {1: (0.12,), 2: (0.29,), 3: (0.22, 0.39), 4: (0.49, 0.58, 0.68), 5: (0.33, 0.58),
                  6: (0.68, 0.69, 0.7, 0.76), 7: (0.49,), 8: (0.89, 0.89, 0.91, 0.92)}


def evidence(match_len: int, prob: float) -> int:
    """The class of a suffix draft's evidence, 1..8: the matched context length (1, 2-3, 4-7, 8 or more
    tokens) and whether its first token followed that context at least half the time (``prob``: the
    tree's empirical probability of its first node). Acceptance differs by class far more than by request:
    a single matched token's continuation is right about a quarter of the time, a match of 8 or more
    nearly always, a first token seen under half the time rarely (scripts/suffix_evidence_probe.py)."""
    length = min(max(match_len, 1).bit_length(), 4)  # 1, 2-3, 4-7, 8+ -> 1..4
    return 2 * length - (prob < 0.5)


def _tree(tokens: list[int], parents: list[int], k: int) -> DraftTree:
    """A DraftTree of at most k nodes from the cache's (tokens, parents: index or -1). Nodes are put in
    depth order (stable) unless parents already precede children; either way the first k nodes hold
    every ancestor of each of them."""
    order = list(range(len(tokens)))
    if any(p >= i for i, p in enumerate(parents)):
        order.sort(key=lambda i: _depth(parents, i))
    order = order[:k]
    index = {old: new for new, old in enumerate(order)}
    return DraftTree([tokens[i] for i in order], [index[parents[i]] if parents[i] >= 0 else -1 for i in order])


def _depth(parents: list[int], i: int) -> int:
    d = 0
    while parents[i] >= 0:
        i, d = parents[i], d + 1
    return d
