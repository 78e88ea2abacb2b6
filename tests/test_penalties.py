"""Presence, frequency and repetition penalties: vLLM's formulas, applied to every verify row with the
draft tokens on its path counted as output, so speculation keeps the output plain decoding gives."""
import pytest
import torch

from specdecode import SamplingParams
from specdecode.errors import InvalidRequestError
from specdecode.sampling import apply_penalties
from tiny_models import hf_model, tiny_llm

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 100, 200, 1, 2]]
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.3)


def reference_penalties(x: torch.Tensor, p: SamplingParams, prompt: list[int], output: list[int]) -> torch.Tensor:
    """One row [V], token by token as vLLM documents it."""
    x = x.clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def test_apply_penalties_matches_the_formulas():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    params = [SamplingParams(**PENALTIES), SamplingParams(), SamplingParams(frequency_penalty=-0.5),
              SamplingParams(repetition_penalty=0.8)]
    prompts = [[1, 2, 3], [4, 5], [6], [7, 7, 8]]
    outputs = [[3, 9, 9, 9, 10], [1, 1], [11, 11, 12], [8, 13]]
    out = apply_penalties(logits, params, prompts, outputs)
    for i in range(4):
        assert torch.allclose(out[i], reference_penalties(logits[i], params[i], prompts[i], outputs[i]), atol=1e-6)
    assert torch.equal(out[1], logits[1])  # no penalty: the row as it came


def test_penalties_touch_only_seen_tokens_yet_equal_the_whole_row_formula():
    """apply_penalties updates each row's seen tokens alone; its rows equal the whole-row formula bit
    for bit (zero logits included, whose sign a negative penalty flips there), whatever the mix of
    settings in the batch."""
    from specdecode.sampling import _penalize_rows

    g = torch.Generator().manual_seed(1)
    vocab = 3000
    logits = torch.randn(6, vocab, generator=g) * 4
    logits[:, :40] = 0.0
    logits[1, 40:80] = -0.0
    params = [SamplingParams(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.2),
              SamplingParams(frequency_penalty=-0.4, presence_penalty=0.1),
              SamplingParams(),
              SamplingParams(presence_penalty=1.5),
              SamplingParams(repetition_penalty=0.7),
              SamplingParams(repetition_penalty=1.1, presence_penalty=-0.3)]
    prompts = [torch.randint(0, vocab, (200,), generator=g).tolist() for _ in params]
    outputs = [torch.randint(0, 100, (n,), generator=g).tolist() for n in (50, 30, 10, 0, 20, 40)]
    out = apply_penalties(logits, params, prompts, outputs)
    rows = [i for i, p in enumerate(params) if p.penalized]
    want = _penalize_rows(logits[rows], [params[i] for i in rows], [prompts[i] for i in rows], [outputs[i] for i in rows])
    assert torch.equal(out[rows].view(torch.int32), want.view(torch.int32))  # the bits, signs of zeros too
    assert torch.equal(out[2], logits[2])


def plain_penalized_greedy(prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with PENALTIES, one full-sequence forward of the Hugging Face model per token."""
    hf, out = hf_model("llama", dtype=torch.float64), []
    p = SamplingParams(**PENALTIES)
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].float()
            out.append(int(reference_penalties(logits, p, prompt, out).argmax()))
    return out


def test_greedy_with_penalties_is_the_reference_decoding():
    llm = tiny_llm("none")
    got = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **PENALTIES))[0]
    assert got.token_ids == plain_penalized_greedy(PROMPTS[0], 16)
    unpenalized = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    assert got.token_ids != unpenalized.token_ids  # the penalties matter on this prompt


@pytest.fixture(scope="module")
def plain():
    llm = tiny_llm("none")
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **PENALTIES))
    seeded = [llm.generate(p, SamplingParams(temperature=0.9, max_tokens=24, seed=5, ignore_eos=True, **PENALTIES))[0]
              for p in PROMPTS]
    return [o.token_ids for o in greedy], [o.token_ids for o in seeded]


@pytest.mark.parametrize("spec_type,kw", [
    ("draft", dict(draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0)),  # drafts of the unpenalized model
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)),
    ("ngram", dict(draft_fixed=True, draft_max=3)),
])
def test_speculation_keeps_penalized_output(plain, spec_type, kw):
    greedy, seeded = plain
    llm = tiny_llm(spec_type, **kw)
    p = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **PENALTIES)
    assert [o.token_ids for o in llm.generate(PROMPTS, p)] == greedy  # in a batch
    assert llm.generate(PROMPTS[1], p)[0].token_ids == greedy[1]  # alone
    if spec_type == "ngram":  # deterministic drafts at T > 0: exact match, so the seed fixes the text
        for prompt, ref in zip(PROMPTS, seeded):
            out = llm.generate(prompt, SamplingParams(temperature=0.9, max_tokens=24, seed=5, ignore_eos=True,
                                                      **PENALTIES))[0]
            assert out.token_ids == ref


def test_draft_tokens_on_the_path_are_penalized():
    """With every draft accepted, later rows of a verify must count the draft tokens before them."""
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0)
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, frequency_penalty=2.0)
    out = llm.generate(PROMPTS[0], p)[0]
    assert out.token_ids == tiny_llm("none").generate(PROMPTS[0], p)[0].token_ids
    assert out.stats["spec"]["accepted_tokens"] > 0


@pytest.mark.parametrize("kw", [dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                                dict(repetition_penalty=11), dict(presence_penalty=float("nan"))])
def test_penalty_settings_are_checked(kw):
    with pytest.raises(InvalidRequestError, match="penalty"):
        SamplingParams(**kw)
