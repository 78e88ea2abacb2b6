"""Greedy speculative output is token-identical to plain greedy output, for every proposer."""
import pytest
import torch

from specdecode import SamplingParams
from tiny_models import tiny_llm

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
# prompts with repetition so that n-gram lookup finds matches
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 100, 200, 1, 2], [42]]


@pytest.fixture(scope="module")
def plain():
    llm = tiny_llm("none")
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.mark.parametrize("spec_type,kw", [
    ("draft", dict(draft_seed=0)),  # draft = target: everything accepted
    ("draft", dict(draft_seed=7)),  # an unrelated draft: most drafts rejected
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0)),  # a draft that is right part of the time
    ("draft", dict(draft_seed=7, draft_fixed=True, draft_max=5)),
    ("ngram-simple", dict(draft_fixed=True, draft_max=4, ngram_size_n=2)),
    ("ngram", dict(draft_fixed=True, draft_max=3)),
    ("ngram", dict()),
])
def test_greedy_identical(plain, spec_type, kw):
    llm = tiny_llm(spec_type, **kw)
    for prompt, ref in zip(PROMPTS, plain):  # one at a time: single-stream path
        out = llm.generate(prompt, GREEDY)[0]
        assert out.token_ids == ref
    outs = llm.generate(PROMPTS, GREEDY)  # all together: batched verify path
    assert [o.token_ids for o in outs] == plain


def test_full_acceptance_with_identical_draft():
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0)
    out = llm.generate(PROMPTS[0], GREEDY)[0]
    spec = out.stats["spec"]
    assert spec["acceptance_rate"] == 1.0
    assert spec["mean_acceptance_length"] > 4.0  # 4 drafts + 1 per step, except the capped last steps


@pytest.mark.parametrize("spec_type,kw", [
    ("none", {}), ("ngram", dict(draft_fixed=True)), ("draft", dict(draft_seed=0, draft_noise=0.5, draft_fixed=True))])
def test_sampling_runs_and_is_reproducible(spec_type, kw):
    """temperature > 0 through every proposer, including steps with no draft; same seed, same output.
    (With the adaptive draft length, k follows measured timings, so a sampled speculative run is
    reproducible for a fixed draft length — plain decoding always is.)"""
    llm = tiny_llm(spec_type, **kw)
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=3, ignore_eos=True)
    a = llm.generate(PROMPTS[0], p)[0].token_ids
    b = llm.generate(PROMPTS[0], p)[0].token_ids
    assert a == b and len(a) == 12


def test_stops_at_context_length():
    llm = tiny_llm("ngram")
    out = llm.generate([i % 300 for i in range(389)], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.token_ids) == llm.engine.max_model_len


def draft_forwards(llm) -> list[tuple[bool, list[int]]]:
    """Records each forward of the draft model of ``llm``: (whether it computed logits, tokens per row)."""
    prop = llm.engine.proposer
    fed, real = [], prop.runner.forward

    def spy(slots, tokens, *a, **kw):
        fed.append((kw.get("logits", True), [len(t) for t in tokens]))
        return real(slots, tokens, *a, **kw)

    prop.runner.forward = spy
    return fed


def test_draft_model_ingests_the_prompt_during_prefill():
    """The draft's cache takes the prompt with the target's prefill (time to first token): its first
    draft then feeds only the root, never the whole prompt in the middle of decoding."""
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=3)
    fed = draft_forwards(llm)
    prompt = list(range(5, 45))
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert fed[0] == (False, [len(prompt) - 1])  # the prefill chunk
    assert max(n for logits, ns in fed[1:] for n in ns) <= 4  # drafting: root (+ accepted) only
    # The same prompt again: the target takes it from its prefix cache and prefills nothing, and the
    # draft keeps its own entries of the prompt with the slot (speculative/kept.py): it feeds the root.
    fed.clear()
    llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert fed[0] == (True, [1])


def test_draft_model_resumes_its_entries_with_a_prompt_store_hit():
    """A prompt whose KV comes back from the host prompt store (its slot served another prompt since)
    brings the draft's entries of it along (``Proposer.stash``): the draft feeds the root, never the
    prompt again; the output is plain greedy."""
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=3, max_num_seqs=1, prompt_cache_mib=64)
    fed = draft_forwards(llm)
    prompt, other = list(range(5, 45)), list(range(100, 130))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate(prompt, params)[0]
    llm.generate(other, params)  # the slot moves prompt's KV and the draft's entries to the store
    fed.clear()
    again = llm.generate(prompt, params)[0]
    assert llm.engine.prefix_cache.store.hit_tokens == len(prompt) - 1
    assert fed[0] == (True, [1])
    assert again.token_ids == first.token_ids == tiny_llm().generate(prompt, params)[0].token_ids


@pytest.mark.integration
def test_smollm2_quantized_greedy_identical_for_every_proposer():
    """On the real SmolLM2 GGUF in its default low-bit form (native int4/int8 kernels), greedy
    speculative output equals plain greedy output for every proposer: verified tokens get the bits
    that decoding them one at a time gives (row-invariant kernels, row_exact verify attention)."""
    from specdecode import LLM
    from specdecode.kernels import native_kernels

    if native_kernels() is None:
        pytest.skip("native kernels not buildable here (PyTorch's kernels are not row-invariant)")
    try:
        from specdecode.store import resolve_model
        path = str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    plain = LLM(path, max_model_len=512)
    ids = plain.encode_chat([{"role": "user", "content": "Write a Python function that checks whether a "
                                                         "number is prime, then explain it."}])
    params = SamplingParams(temperature=0, max_tokens=48)
    expected = plain.generate(ids, params)[0].token_ids
    for kw in (dict(spec_type="ngram-simple", draft_fixed=True), dict(spec_type="ngram"),
               dict(spec_type="draft", model_draft=path, draft_fixed=True, draft_max=4),
               dict(spec_type="eagle3", draft_fixed=True), dict(spec_type="eagle3", num_steps=3, eagle_topk=2,
                                                                num_draft_tokens=6, draft_fixed=True)):
        llm = LLM("smollm2-135m-instruct", max_model_len=512, _model=plain.engine.model,
                  _tokenizer=plain.tokenizer, **kw)
        out = llm.generate(ids, params)[0]
        assert out.token_ids == expected, kw
        if kw["spec_type"] in ("draft", "eagle3"):
            assert out.stats["spec"]["draft_tokens"] > 0, kw


def test_draft_model_with_a_head_vocabulary(plain, tmp_path):
    """--draft-vocab auto: with an EAGLE-3 head at hand, the draft model's LM head keeps the rows of
    the head's draft vocabulary. Its logits there are the full head's, it never drafts another token,
    and the output stays identical; --draft-vocab full keeps every row."""
    from safetensors.torch import save_file

    ids = torch.arange(0, 384, 2)  # the even ids: 192 of the tiny model's 384
    (tmp_path / "head").mkdir()
    save_file({"d2t": ids - torch.arange(len(ids))}, str(tmp_path / "head" / "model.safetensors"))
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0, head=str(tmp_path / "head"))
    prop = llm.engine.proposer
    assert torch.equal(prop.vocab, ids)
    h = torch.randn(3, prop.model.cfg.hidden_size, dtype=torch.float64)
    assert torch.allclose(prop.lm_head(h), prop.model.compute_logits(h)[:, ids].to(h.dtype))
    drafted = []
    real = prop.propose

    def spy(seqs, max_tokens):
        trees = real(seqs, max_tokens)
        drafted.extend(t for tree in trees for t in tree.tokens)
        return trees

    prop.propose = spy
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == plain
    assert drafted and all(t % 2 == 0 for t in drafted)
    full = tiny_llm("draft", draft_seed=0, draft_vocab="full", head=str(tmp_path / "head")).engine.proposer
    assert full.vocab is None and full.lm_head is None
