"""A seed means the same text with or without speculation: every output position draws its random
numbers from (seed, position), and deterministic drafts are verified by exact match, so the emitted
tokens are those plain sampling emits, alone or in a batch, whatever the drafts."""
from __future__ import annotations

import pytest

from specdecode import SamplingParams
from test_eagle import PROMPTS, forced_head, llm as eagle_llm, random_head, target
from specdecode.speculative.suffix import available
from tiny_models import tiny_llm

PROMPT_A = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]  # repeats: n-gram drafts are found and often accepted
PROMPT_B = [9, 8, 7, 9, 8, 7, 9, 8]


def sampled(seed, **kw):
    return SamplingParams(temperature=kw.pop("temperature", 0.9), top_k=kw.pop("top_k", 30), max_tokens=32,
                          seed=seed, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def plain_outputs():
    llm = tiny_llm("none")
    return {(p, s): llm.generate(list(p), sampled(s))[0].token_ids for p in (tuple(PROMPT_A), tuple(PROMPT_B))
            for s in range(4)}


@pytest.mark.parametrize("spec_type, kw", [
    ("ngram-simple", dict(draft_fixed=True, ngram_size_n=2)), ("ngram", dict(draft_fixed=True)), ("ngram", {}),
    ("ngram-mod", dict(draft_fixed=True, ngram_mod_n_match=2)),
    pytest.param("suffix", dict(draft_fixed=True), marks=pytest.mark.skipif(not available(), reason="no arctic")),
    ("auto", dict(draft_fixed=True, ngram_mod_n_match=2)),
    ("ngram,ngram-mod", dict(ngram_mod_n_match=2))])
def test_seeded_text_is_plain_text_for_deterministic_drafts(plain_outputs, spec_type, kw):
    llm = tiny_llm(spec_type, **kw)
    drafted = 0
    for (p, s), want in plain_outputs.items():
        out = llm.generate(list(p), sampled(s))[0]
        assert out.token_ids == want, (p, s)
        drafted += out.stats["spec"]["draft_tokens"]
    assert drafted > 0


def test_seeded_text_is_plain_text_in_a_batch(plain_outputs):
    """Requests with different seeds (and a greedy one) verified together: each gets its solo text."""
    llm = tiny_llm("ngram", max_num_seqs=4, draft_fixed=True)
    eng = llm.engine
    reqs = [(PROMPT_A, 0), (PROMPT_B, 1), (PROMPT_A, 2), (PROMPT_B, 3)]
    seqs = [eng.add_request(list(p), sampled(s)) for p, s in reqs]
    while eng.has_work():
        eng.step()
    assert [s.output_ids for s in seqs] == [plain_outputs[(tuple(p), s)] for p, s in reqs]


@pytest.mark.parametrize("knobs", [(3, 1, 4), (3, 2, 6)])
def test_seeded_text_is_plain_text_for_eagle_trees(knobs):
    m = target(bigram=True)
    plain = eagle_llm(m)
    for head in (forced_head(m, noise=0.3), random_head(m)):
        eagle = eagle_llm(m, "eagle3", head, knobs)
        for i, prompt in enumerate(PROMPTS):
            params = sampled(i, temperature=0.7)
            assert eagle.generate(prompt, params)[0].token_ids == plain.generate(prompt, params)[0].token_ids


def test_a_seed_fixes_sampled_draft_model_output_too():
    """Sampled drafts keep the p/q rule (their text may differ from plain sampling's), but drafts,
    coins and draws are keyed by position: the same seed and the same draft lengths give the same
    text. (With adaptive lengths, chosen from measured step times, whether a position was drafted can
    differ between runs, and a drafted position's token is drawn by another rule than a plain one's:
    each run is an exact sample, not the same one.)"""
    kw = dict(draft_fixed=True, draft_max=3)
    a = tiny_llm("draft", draft_seed=0, draft_noise=0.3, **kw).generate(PROMPT_A, sampled(5))[0].token_ids
    b = tiny_llm("draft", draft_seed=0, draft_noise=0.3, **kw).generate(PROMPT_A, sampled(5))[0].token_ids
    assert a == b


def test_different_seeds_give_different_text(plain_outputs):
    assert len({tuple(v) for (p, s), v in plain_outputs.items() if p == tuple(PROMPT_A)}) > 1


@pytest.mark.parametrize("knobs", [(3, 1, 4), (3, 2, 6)])
def test_seeded_text_is_plain_text_for_merged_trees(knobs):
    """An n-gram draft merged into the head's tree every step it finds one: still plain sampling's text."""
    m = target(bigram=True)
    plain = eagle_llm(m)
    for head in (forced_head(m, noise=0.3), random_head(m)):
        merged = eagle_llm(m, "ngram,eagle3", head, knobs, spec_merge="always")
        steps = 0
        for i, prompt in enumerate(PROMPTS):
            params = sampled(i, temperature=0.7)
            out = merged.generate(prompt, params)[0]
            assert out.token_ids == plain.generate(prompt, params)[0].token_ids
            steps += out.stats["spec"]["by_drafter"].get("ngram+eagle3", {"steps": 0})["steps"]
        assert steps > 0
