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
emit it. Equal to the sampling rule with one-hot p, but uses no randomness.

Exact-match rule (deterministic drafts, engine path): at each node reached, sample the target's
token from its row with the uniform of that output position (the request's RandomStream); move to a
child carrying it, or stop and emit it. For a one-hot q it accepts child x with probability p(x) and
otherwise emits a token from p with x excluded, exactly as the multi-round rule does (siblings
included: the sampled token is one of them or none), so it is lossless; and each emitted token is
the one plain sampling emits at that position with the same seed, so a seed means the same text
with or without speculation. Rows with sampled drafts keep the multi-round p/q rule, with coins and
the final draw taken from the same per-position stream."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import argmax_rows, sample
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


def accept_batch(tokens: torch.Tensor, parents: torch.Tensor, target_probs: torch.Tensor,
                 draft_probs: torch.Tensor | None, generator: torch.Generator | None = None, *,
                 greedy: bool, u_target: torch.Tensor | None = None, u_coin: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule for B trees at once (pass ``parents`` on the CPU: its shape decides which
    full-vocabulary updates are needed; the rest may live on the accelerator). The greedy and
    multi-round walks make no device sync; the exact-match walk makes one per tree level reached.

    greedy=True: target_probs may be raw logits (only argmaxes are compared). greedy=False: the
    sampling rules, which with a one-hot row (a greedy request's processed distribution) make exactly
    the greedy decisions whatever their random numbers, so greedy and sampled requests share a batch.
    Random numbers: with ``u_target`` [B, D + 1] (row b's uniform for the token emitted at depth d,
    i.e. after d accepted nodes) and ``u_coin`` [B, n] (node i's acceptance coin), the engine's
    per-position streams: rows whose nodes are all deterministic take the exact-match rule, the
    others the multi-round rule with these coins and final draw. Without them, every row takes the
    multi-round rule with numbers drawn from ``generator``: coins [B, n], then one final draw per row.

    tokens [B, n] long; parents [B, n] long (-1 = root; any value < -1 marks a padding node, never
    tried, so trees of different sizes share one batch); target_probs [B, n+1, V];
    draft_probs [B, n, V] or None (all deterministic). A node whose draft row gives its own token
    probability 0 (e.g. an all-zero row) is treated as deterministic, the only reading under which
    it can have been drafted, so deterministic and sampled nodes can be mixed.
    Returns (last [B]: deepest accepted node or -1, token [B], accepted [B, n] bool: the path)."""
    b, n = tokens.shape
    v = target_probs.shape[-1]
    if greedy:  # ties → lowest index, as in process_logits
        return greedy_walk(tokens, parents, argmax_rows(target_probs.reshape(-1, v)).view(b, n + 1))
    dev = target_probs.device
    par, parents = parents.cpu(), parents.to(dev)
    rows = torch.arange(b, device=dev)
    cur = torch.full((b,), -1, dtype=torch.long, device=dev)  # current node, -1 = root
    accepted = torch.zeros(b, n, dtype=torch.bool, device=dev)
    if u_target is not None and draft_probs is None:  # every node deterministic: exact match throughout
        return _exact_match(tokens, par, target_probs, u_target.to(dev))
    # Nodes processed in index order with "parent == current node" replay the walk exactly: children
    # follow their parent, and siblings come in draft order. Each node is tried at most once, so one
    # coin per node. Only p(x) of the tried token is needed, except that a rejected node with a
    # later sibling needs the full residual (the sibling is tested against it). A rejected last
    # child ends the walk; its residual is applied once, after the loop (for a chain, the only one).
    same = (par[:, :, None] == par[:, None, :]) & (par[:, :, None] >= -1)  # [B, n, n]
    later_sibling = (same & torch.ones(n, n, dtype=torch.bool).triu(1)).any(-1).any(0).tolist()  # [n]
    u = torch.rand(b, n, generator=generator, device=dev) if u_coin is None else u_coin[:, :n].to(dev)
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
    if u_target is None:
        return cur, sample(p, generator), accepted
    u_final = u_target.to(dev)[rows, accepted.sum(1)]  # the position of the emitted token
    token = sample(p, u=u_final)
    exact = ~(~deterministic & (par >= -1).to(dev)).any(1)  # [B] rows whose every real node is deterministic
    if bool(exact.any()):
        e_cur, e_token, e_acc = _exact_match(tokens, par, target_probs, u_target.to(dev))
        cur, token = torch.where(exact, e_cur, cur), torch.where(exact, e_token, token)
        accepted = torch.where(exact[:, None], e_acc, accepted)
    return cur, token, accepted


def greedy_walk(tokens: torch.Tensor, parents: torch.Tensor, best: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The greedy rule for B trees from the target's argmaxes alone: best [B, n+1] long (column 0
    after the root, column i + 1 after node i); tokens, parents as for accept_batch. Returns what
    accept_batch returns."""
    b, n = tokens.shape
    dev = best.device
    tokens, parents = tokens.to(dev), parents.to(dev)
    rows = torch.arange(b, device=dev)
    cur = torch.full((b,), -1, dtype=torch.long, device=dev)  # current node, -1 = root
    accepted = torch.zeros(b, n, dtype=torch.bool, device=dev)
    for i in range(n):
        hit = (parents[:, i] == cur) & (tokens[:, i] == best[rows, cur + 1])
        cur = torch.where(hit, i, cur)
        accepted[:, i] = hit
    return cur, best[rows, cur + 1], accepted


def greedy_paths(tokens: list[list[int]], parents: list[list[int]], best: list[int]
                 ) -> tuple[list[list[int]], list[int]]:
    """greedy_walk's rule on host lists, for a batch whose verify rows are packed: tree b's nodes
    tokens[b], parents[b] (parents precede children), and best, the target's argmax of every row,
    tree b's len(tokens[b]) + 1 rows (the root's, then node i's at 1 + i) after tree b - 1's. Returns
    each tree's accepted path (node indices, root to leaf) and its next token. The engine's greedy
    step uses this: a step's trees hold a few nodes, and a walk over tensors costs ~20 small ops
    (~0.5 ms a step after the weights have streamed through the caches)."""
    paths, nxt, first = [], [], 0
    for tok, par in zip(tokens, parents):
        cur, path = -1, []
        for i, (t, p) in enumerate(zip(tok, par)):
            if p == cur and t == best[first + cur + 1]:
                cur = i
                path.append(i)
        paths.append(path)
        nxt.append(best[first + cur + 1])
        first += len(tok) + 1
    return paths, nxt


def _exact_match(tokens: torch.Tensor, par: torch.Tensor, probs: torch.Tensor, u_target: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The exact-match rule for B trees (par on the CPU, < -1 = padding): level by level, sample the
    target's token at the current node with that depth's uniform, move to the child carrying it."""
    b, n = tokens.shape
    dev = probs.device
    rows = torch.arange(b, device=dev)
    parents = par.to(dev)
    cur = torch.full((b,), -1, dtype=torch.long, device=dev)
    token = torch.zeros(b, dtype=torch.long, device=dev)
    accepted = torch.zeros(b, n, dtype=torch.bool, device=dev)
    active = torch.ones(b, dtype=torch.bool, device=dev)
    flat = probs.reshape(b * (n + 1), -1)  # [B (n + 1), V]: sequence b's node row i at b (n + 1) + i
    if flat.dtype != torch.float32:
        flat = flat.float()
    depth = 0
    while True:
        tok = sample(flat, u=u_target[:, depth], rows=rows * (n + 1) + cur + 1)  # [B]
        match = (parents == cur[:, None]) & (tokens == tok[:, None]) & active[:, None]  # [B, n]
        hit = match.any(1)
        token = torch.where(active & ~hit, tok, token)
        if not bool(hit.any()):
            return cur, token, accepted
        nxt = match.to(torch.int8).argmax(1)  # the first child carrying the token
        accepted[rows[hit], nxt[hit]] = True
        cur = torch.where(hit, nxt, cur)
        active &= hit
        depth += 1


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
