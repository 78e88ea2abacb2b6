"""Sampling through the whole engine has the target's distribution, for every proposer.

The acceptance rule's own statistical test (test_accept.py) checks the rule alone. This one runs the
engine end to end on the real SmolLM2-135M in float32 (on the int4 path batched and one-row forwards
round differently, and top-k turns such differences into different supports: a batch-invariance
question, not a rule question): batch 16 (and 1), prefix caching on (every request shares the
prompt, so later ones reuse the first one's KV), --draft-fixed so that every step verifies a draft,
chains and trees. Plain decoding draws one sample set, each configuration another, with disjoint
seeds; a two-sample chi-square test on the joint of the first three tokens (T = 2, top-k 3: at most
27 cells, cells expected below 5 pooled) must not tell them apart. Threshold: p > 1e-3 for each of
the ~10 comparisons, so a correct engine fails this with probability about 1 % for a given seed set;
the seeds are fixed, so the outcome is reproducible. The same test must reject a deliberately
wrong rule (one random number reused at every position of a draft, which correlates the tokens)."""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from specdecode import SamplingParams

N = 480
ALPHA = 1e-3
PROMPT_TEXT = "1 2 3 1 2 3 1 2 3 1 2"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smollm2():
    from specdecode import LLM
    from specdecode.loader import load_checkpoint
    try:
        from specdecode.store import resolve_model
        path = str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    n = torch.get_num_threads()
    torch.set_num_threads(2)  # a real model: both cores pay here (conftest's one thread suits tiny ones)
    plain = LLM(path, spec_type="none", quant="none", dtype="float32", max_model_len=256, max_num_seqs=16)
    draft = load_checkpoint(path, torch.float32, "cpu", "int4")  # a draft whose q differs from p
    yield path, plain, draft
    torch.set_num_threads(n)


def sample(llm, seeds, batch: int = 16, **penalties) -> Counter:
    """The first three tokens of one request per seed, ``batch`` requests in flight at a time; the
    draft tokens verified on the way are counted in ``.drafted``, the steps by drafter in ``.by``."""
    eng = llm.engine
    prompt = llm.tokenizer.encode(PROMPT_TEXT)
    out, pending, drafted, by = Counter(), list(seeds), 0, Counter()
    while pending:
        seqs = [eng.add_request(prompt, SamplingParams(temperature=2.0, top_k=3, max_tokens=3, seed=s,
                                                       ignore_eos=True, **penalties)) for s in pending[:batch]]
        pending = pending[batch:]
        while eng.has_work():
            eng.step()
        out.update(tuple(s.output_ids) for s in seqs)
        drafted += sum(s.stats.draft_tokens for s in seqs)
        for s in seqs:
            by.update({name: d["steps"] for name, d in s.stats.by_drafter.items()})
    out.drafted, out.by = drafted, by
    return out


def two_sample_pvalue(a: Counter, b: Counter) -> float:
    """Chi-square test of homogeneity for two samples over the same cells (expected < 5 pooled)."""
    cells = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    rows, pooled = [], [0, 0]
    for c in cells:
        x, y = a[c], b[c]
        if (x + y) * min(na, nb) / (na + nb) < 5:
            pooled[0] += x
            pooled[1] += y
        else:
            rows.append((x, y))
    if sum(pooled):
        rows.append(tuple(pooled))
    stat = 0.0
    for x, y in rows:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    df = len(rows) - 1
    if df < 1:
        return 1.0
    from scipy.stats import chi2
    return float(chi2.sf(stat, df))


@pytest.fixture(scope="module")
def reference(smollm2):
    return sample(smollm2[1], range(N))


CONFIGS = {
    "ngram-simple": dict(spec_type="ngram-simple", ngram_size_n=1),
    "ngram": dict(spec_type="ngram"),
    "ngram-mod": dict(spec_type="ngram-mod", ngram_mod_n_match=2),
    "suffix": dict(spec_type="suffix"),
    # SmolLM2 has a bundled EAGLE-3 head: the draft's q lives on its 8192-token vocabulary
    "draft (sampled q, head vocabulary)": dict(spec_type="draft"),
    "draft (sampled q, full vocabulary)": dict(spec_type="draft", draft_vocab="full"),
    "eagle3 chain": dict(spec_type="eagle3", num_steps=3, eagle_topk=1, num_draft_tokens=4),
    "eagle3 tree": dict(spec_type="eagle3", num_steps=3, eagle_topk=2, num_draft_tokens=6),
    "chain suffix,ngram-mod,draft": dict(spec_type="suffix,ngram-mod,draft", ngram_mod_n_match=2),
    # every step where ngram-mod finds a draft verifies it merged into the head's tree
    "merged ngram-mod+eagle3 tree": dict(spec_type="ngram-mod,eagle3", ngram_mod_n_match=2, spec_merge="always",
                                         num_steps=3, eagle_topk=2, num_draft_tokens=6),
}


def build(smollm2, **kw):
    from specdecode import LLM

    path, plain, draft = smollm2
    if "suffix" in kw["spec_type"]:
        from specdecode.speculative.suffix import available
        if not available():
            pytest.skip("arctic-inference not installed")
    uses_draft = "draft" in kw["spec_type"].split(",")
    if uses_draft:
        # Every step drafts its full room. With --draft-p-min's stop, a draft whose q is this close
        # to p drafts one token per request (T = 2 spreads q below p_min) and is accepted almost
        # always, so on some hosts no step would verify a second draft token.
        kw.setdefault("draft_p_min", 0.0)
    return LLM("smollm2-135m-instruct", quant="none", dtype="float32", max_model_len=256, max_num_seqs=16,
               draft_fixed=True, draft_max=3, model_draft=path if uses_draft else None,
               _model=plain.engine.model, _tokenizer=plain.tokenizer, _draft=draft if uses_draft else None, **kw)


@pytest.mark.parametrize("name", CONFIGS)
def test_engine_sampling_matches_plain_decoding(smollm2, reference, name):
    llm = build(smollm2, **CONFIGS[name])
    if name.startswith("draft"):
        assert (llm.engine.proposer.vocab is None) == ("full" in name)
    got = sample(llm, range(10**6, 10**6 + N))
    p = two_sample_pvalue(reference, got)
    assert p > ALPHA, (name, p, reference.most_common(5), got.most_common(5))
    assert got.drafted > N  # drafts were verified: the rule really ran
    if name.startswith("merged"):
        assert got.by["ngram-mod+eagle3"] > N // 4, got.by  # merged trees were verified


# the prompt repeats 1 2 3, and the first tokens repeat it too: every penalty moves this distribution
PENALTIES = dict(repetition_penalty=1.5, frequency_penalty=0.8, presence_penalty=0.5)


@pytest.fixture(scope="module")
def penalized_reference(smollm2):
    return sample(smollm2[1], range(N), **PENALTIES)


def test_penalized_sampling_matches_plain_decoding(smollm2, reference, penalized_reference):
    """Each verify row penalizes the draft tokens on its path, and the p/q rule with a q the penalties
    never touched (the draft model's) gives plain penalized sampling. (Exact-match verification with
    penalties gives plain decoding's seeded text itself: test_penalties.py.)"""
    assert two_sample_pvalue(reference, penalized_reference) < ALPHA  # the penalties matter here
    got = sample(build(smollm2, **CONFIGS["draft (sampled q, head vocabulary)"]), range(4 * 10**6, 4 * 10**6 + N),
                 **PENALTIES)
    p = two_sample_pvalue(penalized_reference, got)
    assert p > ALPHA, (p, penalized_reference.most_common(5), got.most_common(5))
    assert got.drafted > N


def test_engine_sampling_at_batch_one(smollm2, reference):
    llm = build(smollm2, spec_type="ngram-simple", ngram_size_n=1)
    got = sample(llm, range(2 * 10**6, 2 * 10**6 + N // 3), batch=1)
    assert two_sample_pvalue(reference, got) > ALPHA


def test_a_wrong_rule_is_caught(smollm2, reference, monkeypatch):
    """One random number reused at every depth of the exact-match walk: tokens of one step become
    correlated, and the joint of the first three tokens is no longer the target's."""
    import specdecode.speculative.verify as verify

    real = verify._exact_match
    monkeypatch.setattr(verify, "_exact_match",
                        lambda tokens, par, probs, u: real(tokens, par, probs, u[:, :1].expand_as(u)))
    llm = build(smollm2, spec_type="ngram-simple", ngram_size_n=1)
    got = sample(llm, range(3 * 10**6, 3 * 10**6 + N))
    assert two_sample_pvalue(reference, got) < ALPHA


def test_chi_square_helper():
    a = Counter({("x",): 50, ("y",): 50})
    assert two_sample_pvalue(a, Counter({("x",): 48, ("y",): 52})) > 0.5
    assert two_sample_pvalue(a, Counter({("x",): 90, ("y",): 10})) < 1e-6
    assert math.isclose(two_sample_pvalue(a, a), 1.0)
