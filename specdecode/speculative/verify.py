"""The acceptance rule: which draft tokens to keep, and the next token, given the target's
distributions. Pure tensor code, no model.

Sampling rule (multi-round speculative sampling, SpecInfer, Miao et al. 2023, arXiv 2305.09781;
for a chain it is Leviathan et al. 2023's rule). At the current node u, p = the target's processed
distribution after u. Children c_1..c_m of u are tried in draft order; c_j carries token x_j drawn
from q_j. Accept c_j with probability min(1, p(x_j) / q_j(x_j)); on acceptance move to c_j (p becomes
the target row after c_j); on rejection p ← norm(max(0, p - q_j)) and try c_{j+1}. When no child is
left, the next token is sampled from the current p.

Why the emitted tokens are distributed exactly as the target p (proof sketch). One round: x ~ q,
accept w.p. min(1, p(x)/q(x)), else draw y from r = norm(max(0, p - q)). Then
P(out = y) = min(p(y), q(y)) + (1 - Σ_z min(p(z), q(z))) · r(y) = min(p, q)(y) + max(0, p - q)(y) = p(y),
because 1 - Σ min(p, q) = Σ max(0, p - q) is r's normaliser. With m children, "draw y from r" is
replaced by "run the remaining m-1 rounds against target r"; by induction on m that procedure
outputs exactly r, provided the later children's tokens are independent of this round (i.i.d.
siblings, or deterministic tokens: a one-hot q is a point mass, and a duplicate is simply never
accepted since r already excludes it). With no children the token is drawn from p directly.
Trees, by induction over depth: the first emitted token is distributed as p_root. Given that it is
x_j via accepting c_j, the subtree under c_j was drafted from the context ending in x_j, independently
of the sibling draws and coin flips, so it is a fresh draft for that context, and the same argument
gives the next token distributed as the target row after c_j, and so on. A one-hot q at x means:
accept w.p. p(x), residual = p with x zeroed.

Greedy rule: at each node take the argmax of its target row; move to a child carrying it or stop and
emit it. Equal to the sampling rule with one-hot p, but uses no randomness."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import sample
from .tree import DraftTree


@dataclass
class AcceptResult:
    path: list[int]  # accepted node indices, root excluded, root-to-leaf order
    token: int  # correction token after a rejection, or bonus token after the deepest accepted node


def accept(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None = None, *,
           greedy: bool) -> AcceptResult:
    """target_probs [n+1, V]: row 0 = target's processed distribution after the root, row i+1 after
    node i. tree.draft_probs [n, V] or None (deterministic drafts)."""
    n = len(tree)
    dev = target_probs.device
    tokens = torch.tensor([tree.tokens], dtype=torch.long, device=dev).reshape(1, n)
    parents = torch.tensor([tree.parents], dtype=torch.long).reshape(1, n)  # stays on the CPU
    draft = None if tree.draft_probs is None else tree.draft_probs[None]
    last, token, accepted = accept_batch(tokens, parents, target_probs[None], draft, generator, greedy=greedy)
    return AcceptResult(path=accepted[0].nonzero().flatten().tolist(), token=int(token[0]))


def draw_uniforms(generators: list[torch.Generator | None], sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers accept_batch consumes, drawn from each row's own generator (on the CPU)
    in the order a one-row call draws them: (walk [B, max(sizes)] zero-padded, final [B]). Rows
    without a generator (greedy) get zeros, which the rule never needs there."""
    n = max(sizes, default=0)
    walk, final = torch.zeros(len(sizes), n), torch.zeros(len(sizes))
    for b, (g, k) in enumerate(zip(generators, sizes)):
        if g is not None:
            walk[b, :k] = torch.rand(1, k, generator=g)[0]
            final[b] = torch.rand(1, 1, generator=g)[0, 0]
    return walk, final


def accept_batch(tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                 draft_probs: torch.Tensor | None, generator: torch.Generator | None = None, *,
                 greedy: bool, uniforms: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule for B trees at once, without device syncs (pass ``parents`` on the CPU: its shape
    decides which full-vocabulary updates are needed; the rest may live on the accelerator).

    greedy=True: target_probs may be raw logits (only argmaxes are compared). greedy=False: the
    sampling rule, which with a one-hot row (a greedy request's processed distribution) makes exactly
    the greedy decisions whatever its random numbers, so greedy and sampled requests share a batch.
    Random numbers: ``uniforms`` (walk [B, n], final [B], see draw_uniforms: one generator per row),
    or else drawn here from ``generator``.

    tokens [B, n] long; parents [B, n] long (-1 = root; any value < -1 marks a padding node, never
    tried, so trees of different sizes share one batch); target_probs [B, n+1, V];
    draft_probs [B, n, V] or None (all deterministic). A node whose draft row gives its own token
    probability 0 (e.g. an all-zero row) is treated as deterministic, the only reading under which
    it can have been drafted, so deterministic and sampled nodes can be mixed.
    Returns (last [B]: deepest accepted node or -1, token [B], accepted [B, n] bool: the path)."""
    b, n = tokens.shape
    v = target_probs.shape[-1]
    dev = target_probs.device
    par, parents = parents.cpu(), parents.to(dev)
    rows = torch.arange(b, device=dev)
    cur = torch.full((b,), -1, dtype=torch.long, device=dev)  # current node, -1 = root
    accepted = torch.zeros(b, n, dtype=torch.bool, device=dev)
    if greedy:
        best = target_probs.argmax(-1)  # [B, n+1]; ties → lowest index, as in process_logits
        for i in range(n):
            hit = (parents[:, i] == cur) & (tokens[:, i] == best[rows, cur + 1])
            cur = torch.where(hit, i, cur)
            accepted[:, i] = hit
        return cur, best[rows, cur + 1], accepted

    # Nodes processed in index order with "parent == current node" replay the walk exactly: children
    # follow their parent, and siblings come in draft order. Each node is tried at most once, so one
    # coin per node. Only p(x) of the tried token is needed, except that a rejected node with a
    # later sibling needs the full residual (the sibling is tested against it). A rejected last
    # child ends the walk; its residual is applied once, after the loop (for a chain, the only one).
    same = (par[:, :, None] == par[:, None, :]) & (par[:, :, None] >= -1)  # [B, n, n]
    later_sibling = (same & torch.ones(n, n, dtype=torch.bool).triu(1)).any(-1).any(0).tolist()  # [n]
    if uniforms is None:
        u, u_final = torch.rand(b, n, generator=generator, device=dev), None
    else:
        u, u_final = uniforms[0][:, :n].to(dev), uniforms[1].to(dev)
    qx = torch.ones(b, n, device=dev) if draft_probs is None else \
        draft_probs.gather(-1, tokens[..., None]).squeeze(-1).float()  # [B, n] q(x) of each node
    deterministic = ~(qx > 0)  # also catches NaN
    qx = torch.where(deterministic, torch.ones_like(qx), qx)
    p_res = target_probs[:, 0].float()  # [B, V] residual at the current node, where has_res
    has_res = torch.zeros(b, dtype=torch.bool, device=dev)
    deferred = torch.full((b,), -1, dtype=torch.long, device=dev)  # rejected last child, residual pending
    for i in range(n):
        x = tokens[:, i]
        px = torch.where(has_res, p_res[rows, x], target_probs[rows, cur + 1, x].float())
        # Accept w.p. min(1, p(x)/q(x)) without dividing: u < p/q ⇔ u·q < p (u in [0, 1)).
        ok = u[:, i] * qx[:, i] < px
        tried = parents[:, i] == cur
        hit, miss = tried & ok, tried & ~ok
        accepted[:, i] = hit
        if later_sibling[i]:
            base = torch.where(has_res[:, None], p_res, target_probs[rows, cur + 1].float())
            q = _q_row(i, tokens, draft_probs, deterministic, v)
            p_res = torch.where(miss[:, None], _residual(base, q), p_res)
            has_res = has_res | miss
        else:
            deferred = torch.where(miss, i, deferred)
        has_res = has_res & ~hit
        cur = torch.where(hit, i, cur)

    p = torch.where(has_res[:, None], p_res, target_probs[rows, cur + 1].float())  # [B, V]
    if n:  # with no draft nodes nothing can have been rejected (and there is no node row to gather)
        j = deferred.clamp_min(0)
        q = _q_row(j, tokens, draft_probs, deterministic, v)
        p = torch.where((deferred >= 0)[:, None], _residual(p, q), p)
    return cur, sample(p, generator, u=u_final), accepted


def _q_row(i, tokens, draft_probs, deterministic, vocab: int) -> torch.Tensor:
    """[B, V] distribution node i (an int, or [B] one per row) was drawn from; one-hot if deterministic."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)
    idx = torch.as_tensor(i, device=tokens.device).expand(tokens.shape[0])
    one_hot = torch.zeros(len(rows), vocab, device=tokens.device).scatter_(-1, tokens[rows, idx, None], 1.0)
    if draft_probs is None:
        return one_hot
    return torch.where(deterministic[rows, idx, None], one_hot, draft_probs[rows, idx].float())


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) per row [B, V]. The mass is 0 only when p <= q everywhere, i.e. p == q up
    to rounding, where a rejection has (near) zero probability; p is then the right distribution."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(torch.float32).tiny), p)
