"""ngram-mod, suffix, chains of drafters and auto: greedy output identical to plain decoding, the
cross-request gain of the shared pools, and a controller that picks the drafter that pays."""
from __future__ import annotations

import pytest

from specdecode import SamplingParams
from specdecode.config import SpecConfig
from specdecode.errors import InvalidRequestError
from specdecode.speculative import suffix
from tiny_models import tiny_llm

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5], [9, 8, 7, 9, 8, 7, 9, 8], list(range(10, 40))]
needs_suffix = pytest.mark.skipif(not suffix.available(), reason="arctic-inference not installed")


@pytest.fixture(scope="module")
def plain():
    llm = tiny_llm("none")
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


SPECS = [("ngram-mod", dict(ngram_mod_n_match=2)), ("ngram-mod", dict(ngram_mod_n_match=3, draft_fixed=True)),
         pytest.param("suffix", {}, marks=needs_suffix),
         pytest.param("suffix", dict(draft_fixed=True), marks=needs_suffix),
         pytest.param("suffix,ngram-mod,draft", dict(draft_seed=0, draft_noise=0.3, ngram_mod_n_match=2),
                      marks=needs_suffix),
         ("ngram,draft", dict(draft_seed=0, draft_noise=0.3, draft_fixed=True, draft_max=3)),
         ("auto", {}), ("auto", dict(draft_seed=0, draft_noise=0.3, model_draft="in-memory"))]


@pytest.mark.parametrize("spec_type, kw", SPECS)
def test_greedy_identical(plain, spec_type, kw):
    llm = tiny_llm(spec_type, max_num_seqs=3, **kw)
    for p, want in zip(PROMPTS, plain):
        assert llm.generate(p, GREEDY)[0].token_ids == want
    # and in a batch
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain


@pytest.mark.parametrize("spec_type", ["ngram-mod", pytest.param("suffix", marks=needs_suffix)])
def test_the_pool_is_shared_across_requests(spec_type):
    """A request that repeats an earlier answer drafts it from the shared pool: the second run of the
    same prompt accepts far more than the first (its own prompt alone predicts little). Fixed draft
    lengths: whether a draft is tried then depends on the pool only, not on measured timings."""
    llm = tiny_llm(spec_type, ngram_mod_n_match=4, draft_fixed=True)
    prompt = list(range(50, 80))
    first = llm.generate(prompt, GREEDY)[0]
    second = llm.generate(prompt, GREEDY)[0]
    assert second.token_ids == first.token_ids
    assert second.stats["spec"]["accepted_tokens"] >= 20 > first.stats["spec"]["accepted_tokens"]


def test_ngram_mod_chains_lookups_through_the_table():
    from specdecode.speculative.ngram_mod import NgramModProposer

    prop = NgramModProposer(SpecConfig(spec_type="ngram-mod", ngram_mod_n_match=2))

    class Seq:
        prompt_ids = [5, 6, 7, 8, 5, 6, 9, 9]
        tokens = prompt_ids + [5, 6]
        draft_state = None

    prop.prefill(Seq, 0, len(Seq.prompt_ids) - 1)
    # the prompt's windows: (5,6)->7, (6,7)->8, (7,8)->5, (8,5)->6, (5,6)->9 (last write wins), (6,9)->9
    assert prop.used == 5
    # (5, 6) -> 9, then the window slides over the draft: (6, 9) -> 9, then (9, 9) is unknown: stop
    assert prop.propose([Seq], [3])[0].tokens == [9, 9]
    Seq.tokens = Seq.tokens + list(range(100, 140))  # 32 new tokens or more: they are added, in one chunk
    prop.propose([Seq], [3])
    assert prop.used == len({tuple(Seq.tokens[i - 2:i]) for i in range(2, len(Seq.tokens))})


@needs_suffix
def test_suffix_reads_the_tokens_committed_since_its_last_proposal():
    """Commits cost the suffix tree nothing (a full batch commits for steps on end without proposing):
    the next proposal adds every token committed since, so a request's own output repeating is drafted."""
    from specdecode.speculative.suffix import SuffixProposer

    prop = SuffixProposer(SpecConfig(spec_type="suffix"))

    class Seq:
        prompt_ids = [1, 2, 3]
        tokens = list(prompt_ids)
        draft_state = None

    prop.prefill(Seq, 0, 2)
    for t in [10, 11, 12, 13, 14, 15, 16, 17, 10, 11, 12, 13]:  # its own output, then a repeat begins
        Seq.tokens = Seq.tokens + [t]
        prop.commit(Seq, 0)
    assert prop.propose([Seq], [4])[0].tokens == [14, 15, 16, 17]
    prop.release(Seq)


def test_spec_type_lists_are_validated():
    assert SpecConfig(spec_type="ngram-mod,ngram").spec_type == "ngram-mod,ngram"
    for bad in ("ngram,ngram", "nope", "none,ngram", "auto,ngram", ""):
        with pytest.raises(InvalidRequestError):
            SpecConfig(spec_type=bad)
    assert SpecConfig().spec_type == "auto"


def test_auto_chains_what_the_model_has():
    from specdecode.speculative import auto_members

    eng = tiny_llm("none").engine
    base = ["suffix" if suffix.available() else "ngram", "ngram-mod"]
    assert list(auto_members(SpecConfig(), eng.target)) == base
    assert list(auto_members(SpecConfig(model_draft="x"), eng.target)) == base + ["draft"]
    assert list(auto_members(SpecConfig(head="dir"), eng.target)) == base + ["eagle3"]


# -- the controller picks the drafter that pays ---------------------------------------------------

def test_chain_controller_picks_the_drafter_that_pays_and_falls_back_to_none(monkeypatch):
    """A scripted workload: the draftless member always finds a draft and it is always wrong, the draft
    model (the target's own weights) is always right. The chain soon drafts with the draft model
    only. When the draft model costs as much as the target, nothing pays: it decodes plainly."""
    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.ngram_mod import NgramModProposer
    from specdecode.speculative.tree import DraftTree

    def wrong(self, seqs, max_tokens):  # token 383 never follows in these prompts
        return [DraftTree.chain([383] * min(k, 3)) for k in max_tokens]

    monkeypatch.setattr(NgramModProposer, "propose", wrong)
    llm = tiny_llm("ngram-mod,draft", draft_seed=0, draft_p_min=0.0, max_num_seqs=1)
    eng = llm.engine
    assert isinstance(eng.proposer, ChainProposer)
    eng.planner.costs.observe(1, 1, 1.0)
    for t in range(2, 12):
        eng.planner.costs.observe(1, t, 1.0 + 0.05 * (t - 1))  # cheap verification: drafting pays
    monkeypatch.setattr(eng.planner.costs, "observe", lambda *a: None)  # the script's costs, not the measured ones
    eng.planner.calibrated = True
    draft_model = type(eng.proposer.members[1])
    monkeypatch.setattr(draft_model, "draft_cost", lambda self, n=1: 0.05)
    params = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
    out = llm.generate(list(range(100, 130)), params)[0]
    by = out.stats["spec"]["by_drafter"]
    assert by["draft"]["accepted_tokens"] > 40 and by["draft"]["acceptance_rate"] == 1.0, by
    assert by.get("ngram-mod", {"steps": 0})["steps"] <= 6, by  # tried while its record was young
    # the next request starts from the draft model's engine-wide record: it drafts from the first step,
    # and the loser is not tried before it
    out = llm.generate(list(range(130, 160)), params)[0]
    by = out.stats["spec"]["by_drafter"]
    assert by["draft"]["accepted_tokens"] > 40 and by.get("ngram-mod", {"steps": 0})["steps"] == 0, by
    # drafting with the model now costs more than a target step, and verifying t tokens costs t steps
    # (no parallelism to exploit): nothing pays, plain decoding does best
    monkeypatch.setattr(draft_model, "draft_cost", lambda self, n=1: 1.5)
    eng.planner.costs.v = {(1, t): float(t) for t in range(1, 12)}
    out = llm.generate(list(range(200, 230)), params)[0]
    by = out.stats["spec"]["by_drafter"]
    assert by.get("draft", {"steps": 0})["steps"] <= 3 and by.get("ngram-mod", {"steps": 0})["steps"] <= 3, by


def test_a_chain_members_record_fades_while_another_member_drafts():
    """Every member's record fades each step, chosen or not: a member that lost early in a long request
    drifts back to its prior and is tried again (text changes character: prose, then a code block).
    A model member whose drafts were rejected fades slower (controller.py's backoff), so it takes a
    few hundred steps here."""
    from types import SimpleNamespace

    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.proposer import Proposer

    chain = ChainProposer([Proposer(), Proposer()])
    seq = SimpleNamespace(draft_state=None)
    st = chain._st(seq)
    st.choice = 0
    for _ in range(8):
        chain.observe(seq, 3, 3, 0)  # member 0: every draft rejected
    low = st.acceptance[0].alphas(1)[0]
    st.choice = 1
    for _ in range(500):
        chain.observe(seq, 3, 3, 3)  # member 1 drafts well for a long while
    assert low < 0.3 and st.acceptance[0].alphas(1)[0] > 0.7


def test_a_draftless_members_drafts_are_valued_by_their_evidence_class():
    """A draftless member whose drafts come in two evidence classes, one always right and one always
    wrong (as suffix's long and one-token matches): the chain learns each class apart and drafts only
    the good one (one record for both would settle near 0.5, where both pay). A finished request's
    class records become the next request's priors: its first draft of the wrong class is not tried."""
    from types import SimpleNamespace

    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.controller import best_rate
    from specdecode.speculative.proposer import Proposer
    from specdecode.speculative.tree import DraftTree

    class Classed(Proposer):
        draftless = True

        def propose(self, seqs, max_tokens):
            return [DraftTree([7], [-1], evidence=s.cls) for s in seqs]

    chain = ChainProposer([Classed(), Classed()])  # two members: a chain (one member is itself)
    chain.members[1].propose = lambda seqs, k: [DraftTree.empty() for _ in seqs]

    def verify(t):
        return 1.0 + 0.3 * (t - 1)

    def value(alphas, cost, depth, k_max, catch_up=0.0):
        return best_rate(alphas, cost, verify, k_max, depth, catch_up)

    def step(seq, cls):
        seq.cls = cls
        chain.plan([seq], [1], value, verify=verify)
        drafted = chain._st(seq).choice is not None
        chain.observe(seq, int(drafted), int(drafted), int(drafted and cls == 2))
        return drafted

    seq = SimpleNamespace(draft_state=None, cls=0)
    for i in range(40):
        step(seq, 1 + i % 2)
    assert [step(seq, 1), step(seq, 2)] == [False, True]
    chain.release(seq)
    fresh = SimpleNamespace(draft_state=None, cls=0)
    assert [step(fresh, 1), step(fresh, 2)] == [False, True]


def test_a_classes_measured_prior_decides_its_first_draft():
    """A fresh engine, no request finished yet: a draft of an evidence class the drafter ships a measured
    prior for (``evidence_prior``: right 10 % of the time, below this cost curve's break-even 0.3) is not
    tried, while a class without one starts from the optimistic prior and is. Without the measured
    prior, every class's first drafts would be tried at 0.8 (verify rows wasted until the record learns)."""
    from types import SimpleNamespace

    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.controller import best_rate
    from specdecode.speculative.proposer import Proposer
    from specdecode.speculative.tree import DraftTree

    class Classed(Proposer):
        draftless = True

        def propose(self, seqs, max_tokens):
            return [DraftTree([7], [-1], evidence=s.cls) for s in seqs]

        def evidence_prior(self, evidence):
            return (0.1,) if evidence == 1 else ()

    chain = ChainProposer([Classed(), Classed()])
    chain.members[1].propose = lambda seqs, k: [DraftTree.empty() for _ in seqs]

    def verify(t):
        return 1.0 + 0.3 * (t - 1)

    def value(alphas, cost, depth, k_max, catch_up=0.0):
        return best_rate(alphas, cost, verify, k_max, depth, catch_up)

    drafted = []
    for cls in (1, 2):
        seq = SimpleNamespace(draft_state=None, cls=cls)
        chain.plan([seq], [1], value, verify=verify)
        drafted.append(chain._st(seq).choice is not None)
        assert chain._record(chain._st(seq), 0).alphas(1) == pytest.approx([0.1 if cls == 1 else 0.8])
    assert drafted == [False, True]


@needs_suffix
def test_suffix_ships_a_prior_for_every_evidence_class():
    """Every class ``suffix.evidence`` yields has a measured prior (per position, each in (0, 1))."""
    from specdecode.speculative.suffix import SuffixProposer, evidence

    prop = SuffixProposer(SpecConfig(spec_type="suffix"))
    classes = {evidence(n, p) for n in (1, 2, 3, 4, 7, 8, 30) for p in (0.1, 0.49, 0.5, 1.0)}
    assert classes == set(range(1, 9))
    for c in classes:
        prior = prop.evidence_prior(c)
        assert prior and all(0 < a < 1 for a in prior), c


@pytest.mark.parametrize("proposed", [False, True])
def test_a_draftless_draft_that_is_not_verified_still_counts_in_its_record(proposed):
    """In a batch where drafting does not pay, the engine verifies no draft, though each sequence's
    plan chose a member (valued for that sequence alone). The draftless members' drafts are found and
    never verified; the tokens each step emits still show them right or wrong, so their records move
    (records fed by verified drafts alone would rest at the optimistic prior). ``proposed``: the step
    asks the chain for drafts with a cap of 0 (a batch where others draft), or not at all."""
    from types import SimpleNamespace

    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.controller import best_rate
    from specdecode.speculative.proposer import Proposer
    from specdecode.speculative.tree import DraftTree

    class Fixed(Proposer):
        draftless = True

        def __init__(self, token):
            self.token = token

        def propose(self, seqs, max_tokens):
            return [DraftTree([self.token], [-1]) for _ in seqs]

    chain = ChainProposer([Fixed(7), Fixed(8)])  # the target always emits 8

    def value(verify):
        return lambda alphas, cost, depth, k_max, catch_up=0.0: best_rate(alphas, cost, verify, k_max, depth, catch_up)

    def cheap(t):
        return 1.0 + 0.1 * (t - 1)

    seq = SimpleNamespace(draft_state=None, tokens=[1, 2, 3])
    for _ in range(30):
        chain.plan([seq], [1], value(cheap), verify=cheap)
        if proposed:
            assert chain.propose([seq], [0])[0].tokens == []
        seq.tokens.append(8)
        chain.commit(seq, 0, None)
        chain.observe(seq, 0, 0, 0)
    st = chain._st(seq)
    assert st.acceptance[0].alphas(1)[0] < 0.2 and st.acceptance[1].alphas(1)[0] > 0.9
    chain.plan([seq], [1], value(cheap), verify=cheap)
    assert st.choice == 1


# -- merged drafts ----------------------------------------------------------------------------------

def test_tree_union_shares_common_prefixes_and_keeps_its_limit():
    from specdecode.speculative.tree import DraftTree

    head = DraftTree.chain([5, 6, 7])
    other = DraftTree([5, 8, 9, 6], [-1, 0, 1, 0])  # 5 is shared; 5->6 too; 8 branches off at depth 2
    union, held = head.union(other, limit=10)
    assert (union.tokens, union.parents, held) == ([5, 6, 7, 8, 9], [-1, 0, 1, 0, 3], 4)
    assert [union.match(t) for t in ([5, 6, 7, 1], [5, 8, 9], [5, 8, 1], [4])] == [3, 3, 2, 0]
    assert head.match([5, 8, 9]) == 1 and other.match([5, 6, 7]) == 2
    union, held = head.union(other, limit=4)  # room for 8 only: other's first 2 nodes
    assert (union.tokens, union.parents, held) == ([5, 6, 7, 8], [-1, 0, 1, 0], 2)


class _Scripted:
    """A drafter that always drafts the same chain (a stand-in for a head or an n-gram pool)."""

    def __new__(cls, name, tokens, draftless, cost=0.0):
        from specdecode.speculative.proposer import Proposer
        from specdecode.speculative.tree import DraftTree

        class P(Proposer):
            chain_drafts = False

            def propose(self, seqs, max_tokens):
                return [DraftTree.chain(tokens[:k]) for k in max_tokens]

            def draft_cost(self, n=1):
                return cost

            @property
            def max_tokens(self):
                return len(tokens)

        p = P()
        p.name, p.draftless = name, draftless
        return p


def _step(chain, seq, verify, truth):
    """One planned, proposed, verified (greedy, against ``truth``) and committed step of ``chain``."""
    from specdecode.speculative.controller import best_rate

    chain.plan([seq], [8], lambda a, c, d, k, x=0.0: best_rate(a, c, verify, k, d, x), verify=verify)
    tree = chain.propose([seq], [3])[0]
    accepted = tree.match(truth)
    seq.tokens = seq.tokens + truth[:accepted + 1]
    chain.commit(seq, accepted, None)
    by = chain.drafted_by(seq)
    chain.observe(seq, 3, max(tree.depths(), default=0), accepted)
    return tree, accepted, by


def test_chain_merges_a_draftless_draft_into_the_heads_tree_when_it_pays():
    """The head drafts [1, 2, 3], the n-gram pool [1, 7, 8]; the target continues 1, 7, 8: the union
    accepts the pool's branch. Each member is credited with its own match (head 1, pool 3), so the
    head's record falls, the pool's rises. When verifying more rows costs more than they bring, the
    head drafts alone."""
    from types import SimpleNamespace

    from specdecode.speculative.chain import ChainProposer

    head = _Scripted("eagle3", [1, 2, 3], draftless=False, cost=0.01)
    pool = _Scripted("ngram-mod", [1, 7, 8], draftless=True)
    chain = ChainProposer([head, pool])
    P, H = chain.members.index(pool), chain.members.index(head)  # draftless members come first
    cheap = lambda t: 1.0 + 0.001 * t  # noqa: E731  (verifying a row costs 0.1 % of a step)
    seq = SimpleNamespace(draft_state=None, tokens=[0])
    st = chain._st(seq)
    for _ in range(5):  # the pool's record is poor: alone it would not be chosen over the head
        st.acceptance[P].observe(3, 0)
    tree, accepted, by = _step(chain, seq, cheap, [1, 7, 8, 9])
    assert (tree.tokens, tree.parents) == ([1, 2, 3, 7, 8], [-1, 0, 1, 0, 3])
    assert (accepted, by, seq.tokens) == (3, "ngram-mod+eagle3", [0, 1, 7, 8, 9])
    assert st.matched == {H: 1, P: 3}
    assert st.acceptance[H].tries[:2] == [1.0, 1.0] and st.acceptance[H].hits[:2] == [1.0, 0.0]
    assert st.acceptance[P].hits[2] > 0  # the pool's third position was accepted
    # verifying t tokens costs t steps: extra rows never pay, the head's draft is verified alone
    tree, _, by = _step(chain, seq, lambda t: float(t), [1, 2, 3, 4])
    assert by in ("eagle3", "none") and 7 not in tree.tokens
    off = ChainProposer([_Scripted("eagle3", [1, 2, 3], False, 0.01), _Scripted("ngram-mod", [1, 7, 8], True)],
                        merge="off")
    seq = SimpleNamespace(draft_state=None, tokens=[0])
    for _ in range(5):
        off._st(seq).acceptance[0].observe(3, 0)
    assert _step(off, seq, cheap, [1, 7, 8, 9])[2] == "eagle3"


def test_a_sampled_draft_is_verified_alone():
    """A draft model's draft at T > 0 carries its q: it never merges with a deterministic draft."""
    from types import SimpleNamespace

    import torch

    from specdecode.speculative.chain import ChainProposer
    from specdecode.speculative.tree import DraftTree

    head = _Scripted("draft", [1, 2, 3], draftless=False)
    head.propose = lambda seqs, max_tokens: [DraftTree.chain([1, 2, 3][:k], torch.full((min(k, 3), 10), 0.1))
                                             for k in max_tokens]
    chain = ChainProposer([head, _Scripted("ngram-mod", [1, 7, 8], True)], merge="always")
    seq = SimpleNamespace(draft_state=None, tokens=[0])
    chain.plan([seq], [8], lambda a, c, d, k: (1.0, min(k, 3)), fixed=True)
    assert chain._st(seq).merged is not None
    tree = chain.propose([seq], [3])[0]
    assert tree.tokens == [1, 2, 3] and tree.draft_probs is not None and chain._st(seq).merged is None


@pytest.mark.parametrize("merge", ["always", "auto"])
def test_merged_chains_keep_greedy_output(plain, merge):
    """A draft model and n-gram drafts merged into one tree: greedy output is plain decoding's, alone
    and in a batch; the draft model's cache keeps only the entries its own drafts match."""
    llm = tiny_llm("ngram,draft", max_num_seqs=3, draft_seed=0, draft_noise=0.3, spec_merge=merge,
                   draft_fixed=merge == "always", draft_max=3)
    merged = 0
    for p, want in zip(PROMPTS, plain):
        out = llm.generate(p, GREEDY)[0]
        assert out.token_ids == want
        merged += out.stats["spec"]["by_drafter"].get("ngram+draft", {"steps": 0})["steps"]
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    if merge == "always":
        assert merged > 3


def test_the_draft_models_cache_keeps_only_what_its_own_drafts_match():
    """In a merged step the accepted tokens may be another member's: the draft model's cache keeps
    its entries up to its first draft the sequence does not hold, not num_accepted of them."""
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=3, draft_p_min=0.0)
    eng, prop = llm.engine, llm.engine.proposer
    seq = eng.add_request(PROMPTS[2], GREEDY)
    eng.step()  # prefill and a first step
    drafts = prop.propose([seq], [3])[0].tokens
    st = seq.draft_state
    root_end = len(seq.tokens)  # entries of positions < root_end hold the sequence's tokens
    other = (drafts[0] + 1) % 64
    seq.append([other, 5])  # another member's first token accepted, then the target's
    prop.commit(seq, 1, None)
    assert prop.kv.lengths[st.slot] == root_end - st.skipped and st.length == root_end
