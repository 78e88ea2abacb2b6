"""Log probabilities of the output tokens: the model's own at each position, the same figures whatever
drafted the token (the row that verifies it is the row plain decoding computes), cut where the output is."""
import pytest
import torch

from specdecode import SamplingParams
from specdecode.errors import InvalidRequestError
from tiny_models import hf_model, tiny_llm

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 100, 200, 1, 2]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def plain():
    return tiny_llm("none").generate(PROMPTS, GREEDY)


def reference(prompt: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax of the tiny model's logits at the positions that predicted each output token,
    from one full-sequence forward of the Hugging Face model the tiny LLM was built from."""
    hf = hf_model("llama", dtype=torch.float64)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output[:-1]])).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1:].float(), -1)


def test_plain_logprobs_are_the_models(plain):
    for prompt, out in zip(PROMPTS, plain):
        assert len(out.logprobs) == len(out.token_ids)
        ref = reference(prompt, out.token_ids)
        for i, (tok, e) in enumerate(zip(out.token_ids, out.logprobs)):
            assert e.token_id == tok
            assert e.logprob == pytest.approx(float(ref[i, tok]), abs=1e-5)
            top = ref[i].topk(3)
            assert [t for t, _ in e.top] == top.indices.tolist()
            assert [v for _, v in e.top] == pytest.approx(top.values.tolist(), abs=1e-5)
            assert e.top[0][0] == tok  # greedy: the chosen token is the most likely one


@pytest.mark.parametrize("spec_type,kw", [
    ("draft", dict(draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0)),  # every draft accepted
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)),
    ("ngram", dict(draft_fixed=True, draft_max=3)),
])
def test_speculation_gives_plain_decodings_logprobs(plain, spec_type, kw):
    llm = tiny_llm(spec_type, **kw)
    for batch in ([PROMPTS[0]], [PROMPTS[1]], PROMPTS):  # alone and in a batch
        outs = llm.generate(batch, GREEDY)
        refs = plain if len(batch) == 2 else [plain[PROMPTS.index(batch[0])]]
        for out, ref in zip(outs, refs):
            assert out.token_ids == ref.token_ids
            assert [e.token_id for e in out.logprobs] == out.token_ids
            for e, r in zip(out.logprobs, ref.logprobs):
                assert e.logprob == pytest.approx(r.logprob, abs=1e-6)
                assert [t for t, _ in e.top] == [t for t, _ in r.top]
    if kw.get("draft_noise") is None and spec_type == "draft":  # drafted tokens were verified in rows > 0
        assert outs[0].stats["spec"]["accepted_tokens"] > 0


def test_sampled_tokens_get_their_logprobs_under_the_raw_model():
    llm = tiny_llm("ngram", draft_fixed=True, draft_max=3)
    p = SamplingParams(temperature=1.5, top_k=5, max_tokens=16, seed=11, ignore_eos=True, logprobs=0)
    out = llm.generate(PROMPTS[1], p)[0]
    ref = reference(PROMPTS[1], out.token_ids)
    assert [e.token_id for e in out.logprobs] == out.token_ids and all(e.top == () for e in out.logprobs)
    assert [e.logprob for e in out.logprobs] == pytest.approx([float(ref[i, t]) for i, t in enumerate(out.token_ids)],
                                                            abs=1e-5)


def test_logprobs_stop_with_the_output():
    llm = tiny_llm("draft", draft_seed=0, draft_fixed=True, draft_max=4, draft_p_min=0.0)
    free = llm.generate(PROMPTS[0], GREEDY)[0]
    stop = free.token_ids[5]  # a token in the middle of a 5-token draft's reach
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1,
                                                  stop_token_ids=(stop,)))[0]
    n = free.token_ids.index(stop) + 1
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[:n]
    assert [e.token_id for e in out.logprobs] == out.token_ids
    assert llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4))[0].logprobs is None


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True])
def test_logprobs_setting_is_checked(bad):
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=bad)


def _smollm2() -> str:
    from specdecode.store import resolve_model
    try:
        return str(resolve_model("smollm2-135m-instruct", quiet=True))
    except Exception as e:  # no network: optional
        pytest.skip(f"SmolLM2 GGUF unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


@pytest.mark.integration
def test_quantized_logprobs_are_bit_identical_with_speculation_in_a_batch():
    """On the int4 path (batch-invariant): the exact floats of plain decoding alone, for drafted tokens too."""
    from specdecode import LLM

    path = _smollm2()
    questions = ["Repeat after me, twice: the quick brown fox jumps over the lazy dog.",
                 "def add(a, b):\n    return a + b\n\nWrite sub in the same style.", "Name three colors."]
    p = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    plain = LLM(path, spec_type="none", threads=2)
    prompts = [plain.encode_chat([{"role": "user", "content": q}]) for q in questions]
    refs = [plain.generate(pr, p)[0] for pr in prompts]
    outs = LLM(path, spec_type="eagle3", draft_fixed=True, threads=2).generate(prompts, p)  # a draft every step
    assert sum(o.stats["spec"]["accepted_tokens"] for o in outs) > 0
    for o, r in zip(outs, refs):
        assert o.token_ids == r.token_ids and o.logprobs == r.logprobs


@pytest.mark.integration
def test_cli_json_carries_logprobs(capsys):
    import json

    from specdecode.cli import main
    path = _smollm2()
    assert main(["generate", "--model", path, "-p", "def add(a, b):", "-n", "6", "--temperature", "0",
                 "--json", "--logprobs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    lps = out["logprobs"]
    assert [e["token_id"] for e in lps] == out["token_ids"] and len(lps) == 6
    for e in lps:
        assert e["logprob"] <= 0 and len(e["top"]) == 2 and e["top"][0] == [e["token_id"], e["logprob"]]
    assert "".join(e["token"] for e in lps) == out["text"]
