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
    eng.costs.observe(1, 1, 1.0)
    for t in range(2, 12):
        eng.costs.observe(1, t, 1.0 + 0.05 * (t - 1))  # cheap verification: drafting pays
    monkeypatch.setattr(eng.costs, "observe", lambda *a: None)  # the script's costs, not the measured ones
    eng._calibrated = True
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
    eng.costs.v = {(1, t): float(t) for t in range(1, 12)}
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
