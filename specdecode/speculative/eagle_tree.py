"""EAGLE-2 tree growth for a batch of sequences (speculative/eagle.py drafts with it): depth 1 = the
top-k tokens of the last committed entry; each later step feeds the k best frontier nodes (by path
log-probability) as head entries that see the committed prefix and their own ancestors (tree mask), and
scores their top-k children; finally the best ``num_draft_tokens - 1`` nodes overall are kept (parents
score at least as high as their children, so the set is closed under ancestors). With --eagle-topk 1
the tree is a chain, grown without masks (``_chain``)."""
from __future__ import annotations

import torch

from ..models.eagle import EagleHead
from ..runtime.context import Context, use_context
from ..runtime.kv_cache import KVCache
from .tree import DraftTree


def grow(head: EagleHead, kv: KVCache, backend, K: int, x_last: torch.Tensor, entries: list[tuple[int, int]],
     root_pos: list[int], steps: int) -> list[list[tuple]]:
    """EAGLE-2 expansion for B rows at once: x_last [B, H] the pre-norm output of each row's newest
    committed entry, entries[b] = (its head KV slot, committed entries in it), K = --eagle-topk. Draft
    entries are written past the committed ones (never committed). Returns per row the candidates in
    creation order as (score, target token, parent candidate index or -1, depth)."""
    if K == 1:
        return _chain(head, kv, backend, x_last, entries, root_pos, steps)
    return _tree(head, kv, backend, K, x_last, entries, root_pos, steps)


def _tree(head: EagleHead, kv: KVCache, backend, K: int, x_last: torch.Tensor, entries: list[tuple[int, int]],
          root_pos: list[int], steps: int) -> list[list[tuple]]:
    """grow() for any K: frontiers of K nodes, each seeing its ancestors through a visibility mask."""
    h = head
    B, dev = x_last.shape[0], x_last.device
    logp = torch.log_softmax(h.logits(x_last), -1)  # [B, Vd]
    score, tok = logp.topk(K, dim=-1)  # [B, K] frontier = the root's children
    tgt = h.to_target(tok)
    cands = [[(sc, t, -1, 1) for sc, t in zip(srow, trow)] for srow, trow in zip(score.tolist(), tgt.tolist())]
    front = torch.arange(K).expand(B, K).clone()  # candidate index of each frontier node
    hid = x_last[:, None].expand(B, K, -1)  # parent's output for each frontier node
    D = (steps - 1) * K  # draft entries written this proposal (frontiers of depths 1 .. steps-1)
    vis = torch.zeros(B, K, max(D, 1), dtype=torch.bool)  # draft entries each frontier node sees
    fed = torch.tensor([n for _, n in entries]).view(B, 1, 1)
    rel = torch.arange(int(fed.max()) + D).view(1, 1, -1) - fed  # [B, 1, L] key index relative to fed
    for d in range(2, steps + 1):
        off, Ld = (d - 2) * K, int(fed.max()) + (d - 1) * K  # Ld: keys the head sees this step
        vis[:, torch.arange(K), off + torch.arange(K)] = True
        r = rel[..., :Ld]
        drafted = vis.gather(2, r.clamp(0, D - 1).expand(B, K, Ld)) & (r >= 0) & (r < D)
        mask = (r < 0) | drafted  # [B, K, Ld]: the committed prefix, the node's ancestors and itself
        pos = torch.tensor(root_pos).view(B, 1) + d - 2
        ctx = Context(kv, [slot for slot, _ in entries], [n + off for _, n in entries], [K] * B,
                      attn_mask=mask[:, None].to(dev), backend=backend)
        with use_context(ctx, dev):
            x = h.step(h.embed(tgt), hid, pos.expand(B, K).to(dev))
        logp = torch.log_softmax(h.logits(x), -1) + score[..., None]  # [B, K, Vd] path log-probs
        cs, ct = logp.topk(K, dim=-1)  # [B, K, K] each frontier node's best children
        ctg = h.to_target(ct)
        best = cs.flatten(1).topk(K, dim=-1).indices  # [B, K] next frontier among the K*K children
        cs_l, ctg_l, best_c = cs.flatten(1).tolist(), ctg.flatten(1).tolist(), best.cpu()
        for b in range(B):
            base = len(cands[b])
            cands[b] += [(cs_l[b][i], ctg_l[b][i], int(front[b, i // K]), d) for i in range(K * K)]
            front[b] = base + best_c[b]
        par = torch.div(best_c, K, rounding_mode="floor")
        score = cs.flatten(1).gather(1, best)
        tgt = ctg.flatten(1).gather(1, best)
        hid = x.gather(1, par.to(dev)[..., None].expand(B, K, x.shape[-1]))
        vis = vis.gather(1, par[..., None].expand(B, K, vis.shape[-1]))
    return cands


def _chain(head: EagleHead, kv: KVCache, backend, x_last: torch.Tensor, entries: list[tuple[int, int]],
           root_pos: list[int], steps: int) -> list[list[tuple]]:
    """grow() for K = 1, the default: each level is one node per row, whose entry sees the committed
    prefix and the entries before it, i.e. a plain causal decode step (no visibility masks, frontier
    gathers or per-level host transfers: at one row those cost about what the head's forward does).
    The same candidates as grow()'s tree path: (score, token, the previous node or -1, depth)."""
    h = head
    B, dev = x_last.shape[0], x_last.device
    slots, fed = [slot for slot, _ in entries], [n for _, n in entries]
    score, tok = torch.log_softmax(h.logits(x_last), -1).topk(1, dim=-1)  # [B, 1]
    tgt = h.to_target(tok)
    scores, tokens = [score], [tgt]
    pos = torch.tensor(root_pos).view(B, 1)
    x = x_last[:, None]  # [B, 1, H]
    for d in range(2, steps + 1):
        ctx = Context(kv, slots, [n + d - 2 for n in fed], [1] * B, backend=backend)
        with use_context(ctx, dev):
            x = h.step(h.embed(tgt), x, (pos + d - 2).to(dev))
        score, tok = (torch.log_softmax(h.logits(x[:, 0]), -1) + score).topk(1, dim=-1)
        tgt = h.to_target(tok)
        scores.append(score)
        tokens.append(tgt)
    sc, tg = torch.cat(scores, 1).tolist(), torch.cat(tokens, 1).tolist()  # [B, steps]
    return [[(s, t, i - 1, i + 1) for i, (s, t) in enumerate(zip(srow, trow))] for srow, trow in zip(sc, tg)]


def select(cands: list[tuple], n: int) -> DraftTree:
    """The n best candidates by path log-prob (ties: earlier first, so a parent precedes its child),
    in creation order (parents before children, siblings best first)."""
    order = sorted(range(len(cands)), key=lambda i: (-cands[i][0], i))[:n]
    keep = sorted(order)
    index = {c: i for i, c in enumerate(keep)}
    return DraftTree([cands[c][1] for c in keep], [index[cands[c][2]] if cands[c][2] >= 0 else -1 for c in keep])
