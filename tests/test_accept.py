"""The acceptance rule: exact greedy cases, edge cases, and statistical losslessness.

Statistical harness: a synthetic target P(x_t | x_<t) over V=6 tokens (a table row chosen by a hash
of the whole prefix) and a draft Q that deliberately disagrees with it (different logits, different
filters, so each has zeros where the other has mass). We simulate full speculative generation of
the first 3 tokens for many independent sequences at once — draft, verify with accept_batch,
append the accepted tokens and the correction/bonus token, repeat — and compare the empirical
joint of (x1, x2, x3) with the exact joint P by a chi-square test. The same harness with wrong
rules (written here, not in the library) must fail, so the test can tell right from wrong.
accept_batch's shortcuts are checked decision-for-decision against the plain reference_mss."""
import math
from functools import partial

import pytest
import torch

from specdecode.sampling import process_logits, sample
from specdecode.sampling_params import SamplingParams
from specdecode.speculative.tree import DraftTree
from specdecode.speculative.verify import accept, accept_batch

V, M, H0 = 6, 4099, 17  # vocabulary, hash buckets (prime), hash of the prompt
N = 150_000  # sequences per run of the right rule
N_WRONG = 30_000  # wrong rules must fail even with this fewer (a harder test for the harness to pass)
ALPHA = 1e-3  # chi-square p-value threshold

_g = torch.Generator().manual_seed(1234)
_LOGITS_P = torch.randn(M, V, generator=_g) * 1.5
_LOGITS_Q = 0.5 * _LOGITS_P + torch.randn(M, V, generator=_g) * 1.5
P_TABLE = process_logits(_LOGITS_P, SamplingParams(temperature=0.9, top_k=5))  # [M, V], zeros included
Q_TABLE = process_logits(_LOGITS_Q, SamplingParams(temperature=1.3, top_p=0.9))
Q_WRONG = process_logits(_LOGITS_Q, SamplingParams(temperature=2.0))  # not what drafts are drawn from

CHAIN = [-1, 0, 1]
TREE = [-1, -1, 0, 0, 1, 1]  # 2 children per node, depth 2


def child_hash(h, x):
    return (h * 7919 + x + 1) % M


def draft(h, parents, mode, gen, wrong_q=False):
    """Drafts one tree per sequence from Q for contexts h [B]. mode: "sample" (siblings i.i.d.)
    or "top2" (deterministic: the j-th sibling is Q's j-th most likely token).
    Returns tokens [B, n], draft_probs [B, n, V] (None for top2), node hashes [B, n].
    wrong_q (a bug to catch): draft_probs that are not what the tokens were drawn from — Q processed
    at another temperature, or for deterministic drafts Q itself."""
    toks, qs, hs = [], [], []
    for i, par in enumerate(parents):
        ctx = h if par < 0 else hs[par]
        q = Q_TABLE[ctx]  # [B, V]
        rank = parents[:i].count(par)
        x = sample(q, gen) if mode == "sample" else q.topk(2, dim=-1).indices[:, rank]
        toks.append(x)
        qs.append(Q_WRONG[ctx] if wrong_q and mode == "sample" else q)
        hs.append(child_hash(ctx, x))
    q = torch.stack(qs, 1) if mode == "sample" or wrong_q else None
    return torch.stack(toks, 1), q, torch.stack(hs, 1)


def simulate(rule, parents, mode, seed, n=N, wrong_q=False):
    """First 3 generated tokens of n independent speculative generations → [n, 3]."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)
    h = torch.full((n,), H0)
    out = torch.full((n, 3), -1)
    length = torch.zeros(n, dtype=torch.long)
    par = torch.tensor(parents).expand(n, -1)
    while (length < 3).any():  # each round emits >= 1 token
        tokens, q, node_h = draft(h, parents, mode, gen, wrong_q)
        target = torch.cat([P_TABLE[h][:, None], P_TABLE[node_h]], 1)  # [n, k+1, V]
        last, token, accepted = rule(tokens, par, target, q, gen)
        # Path nodes come in index order = depth order (parents precede children).
        new = torch.cat([tokens, token[:, None]], 1)
        keep = torch.cat([accepted, torch.ones(n, 1, dtype=torch.bool)], 1)
        pos = length[:, None] + keep.cumsum(1) - 1
        w = keep & (pos < 3)
        out[rows[:, None].expand_as(w)[w], pos[w]] = new[w]
        length += keep.sum(1)
        h = child_hash(torch.where(last >= 0, node_h[rows, last.clamp_min(0)], h), token)
    return out


def exact_joint():
    """P(x1, x2, x3) [V³] under the target."""
    x = torch.cartesian_prod(*[torch.arange(V)] * 3)  # [V³, 3], same order as the index x1·V² + x2·V + x3
    h1 = child_hash(torch.tensor(H0), x[:, 0])
    h2 = child_hash(h1, x[:, 1])
    return P_TABLE[H0][x[:, 0]] * P_TABLE[h1, x[:, 1]] * P_TABLE[h2, x[:, 2]]


def chi2_pvalue(stat, df):
    try:
        from scipy.stats import chi2
        return float(chi2.sf(stat, df))
    except ImportError:  # Wilson–Hilferty: accurate to well under the 1e-3 threshold for df > 30
        z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
        return 0.5 * math.erfc(z / math.sqrt(2))


def compare(samples):
    """→ (chi-square p-value, total variation, TV bound). Cells with expected count < 5 are pooled;
    a sample in a cell of probability 0 fails outright. TV bound: E[TV] <= ½ Σ sqrt(p(1-p)/N)
    (Jensen), plus sqrt(ln(1/ALPHA) / 2N) by McDiarmid (one sample moves TV by <= 1/N)."""
    p = exact_joint().double()
    n = len(samples)
    counts = torch.bincount(samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2], minlength=V ** 3).double()
    tv = 0.5 * (counts / n - p).abs().sum().item()
    bound = 0.5 * (p * (1 - p) / n).sqrt().sum().item() + math.sqrt(math.log(1 / ALPHA) / (2 * n))
    if counts[p == 0].sum() > 0:
        return 0.0, tv, bound
    exp = p * n
    big = exp >= 5
    obs_cells = torch.cat([counts[big], counts[~big & (p > 0)].sum()[None]])
    exp_cells = torch.cat([exp[big], exp[~big & (p > 0)].sum()[None]])
    stat = ((obs_cells - exp_cells) ** 2 / exp_cells).sum().item()
    return chi2_pvalue(stat, len(obs_cells) - 1), tv, bound


def right_rule(tokens, parents, target, q, gen):
    return accept_batch(tokens, parents, target, q, gen, greedy=False)


def stream_rule(tokens, parents, target, q, gen, same_u=False):
    """The engine's path: per-position uniforms (u_target by depth, u_coin by node) instead of a
    generator; deterministic drafts take the exact-match rule, sampled ones the multi-round rule.
    same_u (a bug to catch): one uniform reused at every depth of the walk."""
    b, n = tokens.shape
    u_target = torch.rand(b, n + 1, generator=gen)
    if same_u:
        u_target = u_target[:, :1].expand(b, n + 1)
    return accept_batch(tokens, parents, target, q, greedy=False, u_target=u_target,
                        u_coin=torch.rand(b, n, generator=gen))


def accept_always(tokens, parents, target, q, gen):
    """Wrong: keeps the first child at every level, then samples from the target."""
    path = []
    for i, par in enumerate(parents[0].tolist()):
        if par == (path[-1] if path else -1):
            path.append(i)
    acc = torch.zeros_like(tokens, dtype=torch.bool)
    acc[:, path] = True
    last = path[-1] if path else -1
    return torch.full((len(tokens),), last), sample(target[:, last + 1], gen), acc


def reference_mss(tokens, parents, target, q, gen, residual=True, retest_with_residual=True):
    """Plain multi-round sampling (full residual at every node), optionally with one of two bugs.
    residual=False: after a rejection p stays the target row instead of norm(max(0, p - q)).
    retest_with_residual=False: later siblings are tested against the node's original p, though the
    final token still comes from the right residual."""
    b, n = tokens.shape
    rows = torch.arange(b)
    cur = torch.full((b,), -1)
    acc = torch.zeros(b, n, dtype=torch.bool)
    p_test = p_res = target[:, 0]
    u = torch.rand(b, n, generator=gen)  # drawn like accept_batch, so that unbroken they agree exactly
    for i in range(n):
        x = tokens[:, i]
        qi = torch.nn.functional.one_hot(x, target.shape[-1]).float() if q is None else q[:, i]
        tried = parents[:, i] == cur
        hit = tried & (u[:, i] * qi[rows, x] < p_test[rows, x])
        miss = (tried & ~hit)[:, None]
        acc[:, i] = hit
        cur = torch.where(hit, i, cur)
        r = (p_res - qi).clamp_min(0) if residual else p_res
        r = torch.where(r.sum(-1, keepdim=True) > 0, r / r.sum(-1, keepdim=True), p_res)
        row = target[:, i + 1]
        stale = torch.where(hit[:, None], row, p_test)
        p_res = torch.where(hit[:, None], row, torch.where(miss, r, p_res))
        p_test = p_res if retest_with_residual else stale
    return cur, sample(p_res, gen), acc


CONFIGS = {"chain-sampled": (CHAIN, "sample"), "chain-deterministic": (CHAIN, "top2"),
           "tree-iid": (TREE, "sample"), "tree-top2": (TREE, "top2")}
WRONG = {"accept-always": (accept_always, False),
         "residual-is-p": (partial(reference_mss, residual=False), False),
         "q-mismatch": (right_rule, True),  # the harness hands the rule a q the drafts were not drawn from
         "siblings-vs-stale-p": (partial(reference_mss, retest_with_residual=False), False)}


@pytest.mark.parametrize("config", CONFIGS)
def test_lossless_with_position_streams(config):
    """The rule as the engine runs it (exact match for deterministic drafts, multi-round p/q for
    sampled ones, numbers by position) has the target's distribution; reusing one number across
    positions (a stream keyed wrongly) is caught by the same criterion."""
    parents, mode = CONFIGS[config]
    pvalue, tv, bound = compare(simulate(stream_rule, parents, mode, seed=7))
    assert pvalue > ALPHA and tv < bound, (pvalue, tv, bound)
    if mode == "top2":
        pvalue, tv, bound = compare(simulate(partial(stream_rule, same_u=True), parents, mode, seed=7, n=N_WRONG))
        assert pvalue < ALPHA and tv > bound, (pvalue, tv, bound)


@pytest.mark.parametrize("config", CONFIGS)
def test_lossless(config):
    assert 0.5 * (P_TABLE - Q_TABLE).abs().sum(-1).mean() > 0.3  # drafts disagree: rejections are common
    parents, mode = CONFIGS[config]
    pvalue, tv, bound = compare(simulate(right_rule, parents, mode, seed=5))
    assert pvalue > ALPHA and tv < bound, (pvalue, tv, bound)


@pytest.mark.parametrize("config, wrong", [(c, w) for c in CONFIGS for w in WRONG
                                           if not (w == "siblings-vs-stale-p" and c.startswith("chain"))])
def test_wrong_rules_fail(config, wrong):
    """Each bug must fail the very criterion the right rule passes (a chain has no siblings, so the
    stale-p bug cannot show there)."""
    parents, mode = CONFIGS[config]
    rule, wrong_q = WRONG[wrong]
    pvalue, tv, bound = compare(simulate(rule, parents, mode, seed=5, n=N_WRONG, wrong_q=wrong_q))
    assert pvalue < ALPHA and tv > bound, (pvalue, tv, bound)


def test_reference_in_this_file_is_right_when_unbroken():
    """reference_mss with no bug enabled passes at N_WRONG, so the failures above come from the bugs."""
    pvalue, tv, bound = compare(simulate(reference_mss, TREE, "sample", seed=6, n=N_WRONG))
    assert pvalue > ALPHA and tv < bound, (pvalue, tv, bound)


def test_batch_matches_plain_reference_exactly():
    """accept_batch only updates the full residual where a later sibling needs it; the plain
    per-node reference_mss does it everywhere. Same seed ⇒ same decisions, on
    random mixed-shape padded batches, sampled and deterministic drafts."""
    g = torch.Generator().manual_seed(11)
    b, n, v = 256, 7, 5
    for seed in range(10):
        parents = torch.stack([torch.tensor([torch.randint(-1, i, (1,), generator=g).item() for i in range(n)])
                               for _ in range(b)])
        sizes = torch.randint(0, n + 1, (b, 1), generator=g)
        parents = torch.where(torch.arange(n) < sizes, parents, -2)  # padding after each row's size
        tokens = torch.randint(0, v, (b, n), generator=g)
        logits = torch.randn(b * (n + 1), v, generator=g)
        target = process_logits(logits, SamplingParams(top_k=4)).reshape(b, n + 1, v)  # with zeros
        q = torch.softmax(torch.randn(b, n, v, generator=g), -1)
        for draft in (q, None):
            got = accept_batch(tokens, parents, target, draft, torch.Generator().manual_seed(seed), greedy=False)
            want = reference_mss(tokens, parents, target, draft, torch.Generator().manual_seed(seed))
            for a, w in zip(got, want):
                assert torch.equal(a, w)


def peaked_rows(argmaxes):
    """[len, V] distributions (not one-hot, to show greedy uses only the argmax) peaking at argmaxes."""
    return torch.nn.functional.one_hot(torch.tensor(argmaxes), V).float() * 0.5 + 0.5 / V


def test_greedy_chain():
    tree = DraftTree.chain([3, 1, 4])
    r = accept(tree, peaked_rows([3, 1, 5, 0]), greedy=True)
    assert (r.path, r.token) == ([0, 1], 5)
    r = accept(tree, peaked_rows([3, 1, 4, 2]), greedy=True)
    assert (r.path, r.token) == ([0, 1, 2], 2)  # all accepted: bonus token from the last row
    r = accept(tree, peaked_rows([0, 1, 4, 2]), greedy=True)
    assert (r.path, r.token) == ([], 0)
    r = accept(DraftTree.empty(), peaked_rows([4]), greedy=True)
    assert (r.path, r.token) == ([], 4)


def test_greedy_tree():
    # root → 0:(2) 1:(5); 0 → 2:(1); 1 → 3:(0) 4:(3); 4 → 5:(2)
    tree = DraftTree([2, 5, 1, 0, 3, 2], [-1, -1, 0, 1, 1, 4])
    r = accept(tree, peaked_rows([5, 0, 3, 0, 0, 3, 1]), greedy=True)
    assert (r.path, r.token) == ([1, 4], 3)  # second child of root, then second child of node 1
    r = accept(tree, peaked_rows([5, 0, 3, 0, 0, 2, 1]), greedy=True)
    assert (r.path, r.token) == ([1, 4, 5], 1)
    r = accept(tree, peaked_rows([2, 1, 0, 0, 0, 0, 0]), greedy=True)
    assert (r.path, r.token) == ([0, 2], 0)
    tied = torch.full((7, V), 1.0 / V)  # ties → lowest index, 0; no child of the root carries it
    r = accept(tree, tied, greedy=True)
    assert (r.path, r.token) == ([], 0)


def test_exact_match_emits_what_plain_sampling_emits():
    """Deterministic drafts verified by exact match: the emitted tokens are those plain sampling draws
    at the same positions with the same numbers, whatever the draft (a chain, a tree, nothing)."""
    g = torch.Generator().manual_seed(4)
    target = process_logits(torch.randn(7, V, generator=g), SamplingParams(temperature=1.0))
    for _ in range(200):
        u = torch.rand(1, 7, generator=g)
        # plain sampling, position by position, along the path the first draft takes
        x0 = int(sample(target[:1], u=u[:, 0])[0])
        tree = DraftTree([x0, (x0 + 1) % V, 3, 1, 2, 0], [-1, -1, 0, 0, 2, 4])
        res = accept_batch(torch.tensor([tree.tokens]), torch.tensor([tree.parents]), target[None], None,
                           greedy=False, u_target=u, u_coin=torch.zeros(1, 6))
        path = res[2][0].nonzero().flatten().tolist()
        assert path[0] == 0  # the sampled token is x0: its child is taken
        emitted, node = [x0], 0
        for depth in range(1, len(path) + 1):  # plain sampling continues from the node reached
            x = int(sample(target[node + 1:node + 2], u=u[:, depth])[0])
            emitted.append(x)
            node = next((i for i in range(6) if tree.parents[i] == node and tree.tokens[i] == x), None)
            if node is None:
                break
        assert [tree.tokens[i] for i in path] + [int(res[1][0])] == emitted


def test_sampling_with_one_hot_target_equals_greedy():
    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(6, V, generator=g), -1)
    tree = DraftTree([2, 5, 1, 0, 3, 2], [-1, -1, 0, 1, 1, 4], draft_probs=q)
    for _ in range(50):
        target = process_logits(torch.randn(7, V, generator=g), SamplingParams(temperature=0))
        for draft in (tree, DraftTree(tree.tokens, tree.parents)):
            assert accept(draft, target, g, greedy=False) == accept(draft, target, greedy=True)


def test_edge_cases():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, V, generator=g), -1)
    # p == q: always accepted.
    for _ in range(20):
        assert accept(DraftTree.chain([1, 2, 3], p[:3].clone()), p, g, greedy=False).path == [0, 1, 2]
    # p(x) = 0: never accepted, and x is excluded from the correction (one-hot q zeroes it).
    p0 = p[:2] * (torch.arange(V) != 4)
    for _ in range(50):
        r = accept(DraftTree.chain([4]), p0 / p0.sum(-1, keepdim=True), g, greedy=False)
        assert r.path == [] and r.token != 4
    # q(x) = 0 although x was drafted: read as a deterministic token, no NaN.
    q = p[:1] * (torch.arange(V) != 2)
    assert 0 <= accept(DraftTree.chain([2], q), p[:2], g, greedy=False).token < V
    # q >= p everywhere (unnormalised q = 2p): max(0, p - q) is all zero → falls back to p.
    out = [accept(DraftTree.chain([1], 2 * p[:1]), p[:2], g, greedy=False) for _ in range(200)]
    assert all(0 <= r.token < V for r in out) and 0 < sum(len(r.path) for r in out) < 200


def test_seed_reproducible():
    g = torch.Generator().manual_seed(9)
    q = torch.softmax(torch.randn(4, V, generator=g), -1)
    tree = DraftTree([2, 5, 1, 0], [-1, -1, 0, 1], draft_probs=q)
    target = torch.softmax(torch.randn(5, V, generator=g), -1)
    a, b = ([accept(tree, target, torch.Generator().manual_seed(s), greedy=False) for s in range(30)] for _ in "ab")
    assert a == b and len({(tuple(r.path), r.token) for r in a}) > 1


def test_batch_with_padding_matches_single_trees():
    trees = [DraftTree([2, 5, 1], [-1, -1, 0]), DraftTree.chain([3]), DraftTree.empty()]
    g = torch.Generator().manual_seed(1)
    targets = [torch.softmax(torch.randn(len(t) + 1, V, generator=g), -1) for t in trees]
    n = 3
    tokens = torch.tensor([t.tokens + [0] * (n - len(t)) for t in trees])
    parents = torch.tensor([t.parents + [-2] * (n - len(t)) for t in trees])  # -2: padding
    target = torch.stack([torch.cat([x, torch.full((n + 1 - len(x), V), 1.0 / V)]) for x in targets])
    last, token, acc = accept_batch(tokens, parents, target, None, greedy=True)
    for b, (t, x) in enumerate(zip(trees, targets)):
        r = accept(t, x, greedy=True)
        assert acc[b].nonzero().flatten().tolist() == r.path and token[b].item() == r.token
        assert last[b].item() == (r.path[-1] if r.path else -1)


def test_greedy_paths_on_host_lists_match_the_tensor_walk():
    """The engine's greedy step walks host lists (greedy_paths); it must accept exactly what the
    tensor rule (accept_batch, greedy) accepts, on random trees whose argmaxes often match a child."""
    from specdecode.speculative.verify import greedy_paths

    g = torch.Generator().manual_seed(7)
    for _ in range(300):
        trees = []
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            n = int(torch.randint(0, 7, (1,), generator=g))
            parents = [int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]
            trees.append(DraftTree([int(torch.randint(0, 3, (1,), generator=g)) for _ in range(n)], parents))
        best = [int(torch.randint(0, 3, (1,), generator=g)) for _ in range(sum(len(t) + 1 for t in trees))]
        paths, nxt = greedy_paths([t.tokens for t in trees], [t.parents for t in trees], best)
        first = 0
        for t, path, token in zip(trees, paths, nxt):
            rows = torch.nn.functional.one_hot(torch.tensor(best[first:first + len(t) + 1]), V).float()
            r = accept(t, rows, greedy=True)
            assert (path, token) == (r.path, r.token)
            first += len(t) + 1
