"""SamplingParams validation, process_logits filters against hand computations, sample(), StopChecker."""
import math

import pytest
import torch

from specdecode.errors import InvalidRequestError
from specdecode.kernels import native_kernels
from specdecode.engine.stop import StopChecker
from specdecode.sampling import argmax_rows, process_logits, sample
from specdecode.sampling_params import SamplingParams

# One row with distinct probabilities, so every filter's cut is easy to compute by hand.
PROBS = torch.tensor([0.05, 0.15, 0.30, 0.10, 0.40])
LOGITS = PROBS.log()[None]  # [1, 5]


def close(a, b):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=torch.float32).reshape(a.shape), atol=1e-6, rtol=0)


def renorm(p):
    p = torch.as_tensor(p, dtype=torch.float32)
    return p / p.sum()


def test_defaults_like_vllm():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.max_tokens, p.seed) == (1.0, 1.0, 0, 0.0, 256, None)
    assert p.stop == () and p.stop_token_ids == () and not p.ignore_eos and not p.greedy
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(stop="###").stop == ("###",)
    as_lists = SamplingParams(stop=["a", "b"], stop_token_ids=[2])
    assert as_lists == SamplingParams(stop=("a", "b"), stop_token_ids=(2,)) and hash(as_lists)


@pytest.mark.parametrize("kw, word", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.1), "min_p"), (dict(max_tokens=0), "max_tokens"),
    (dict(seed="x"), "seed"), (dict(stop=("",)), "stop"), (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    (dict(top_k=1 << 63), "top_k"), (dict(seed=1 << 64), "seed"), (dict(max_tokens=1 << 40), "max_tokens"),
    (dict(stop_token_ids=(1 << 40,)), "stop_token_ids"),
])
def test_validation(kw, word):
    with pytest.raises(InvalidRequestError) as e:
        SamplingParams(**kw)
    msg = str(e.value)
    assert word in msg and "\n" not in msg


def test_temperature():
    close(process_logits(LOGITS, SamplingParams()), PROBS)
    close(process_logits(LOGITS, SamplingParams(temperature=0.5)), renorm(PROBS ** 2))  # exp(2 log p) = p²
    close(process_logits(LOGITS, SamplingParams(temperature=2.0)), renorm(PROBS ** 0.5))


def test_greedy_one_hot_lowest_index_on_ties():
    close(process_logits(LOGITS, SamplingParams(temperature=0)), [0, 0, 0, 0, 1])
    tied = torch.tensor([[1.0, 3.0, 3.0, -2.0]])
    close(process_logits(tied, SamplingParams(temperature=0)), [0, 1, 0, 0])


@pytest.mark.parametrize("native", [True, False])
def test_argmax_rows_is_torch_argmax(native, monkeypatch):
    """The greedy token of each row: the first index of the maximum, a row's first NaN where it has
    one, index 0 for an all -inf row; any vocabulary size (vector tails) and row stride."""
    if native and native_kernels() is None:
        pytest.skip("no native kernels here")
    if not native:
        monkeypatch.setattr("specdecode.sampling.native_kernels", lambda: None)
    g = torch.Generator().manual_seed(0)
    for rows, vocab in ((1, 151936), (7, 1000), (3, 37), (5, 8), (2, 3)):
        x = torch.randn(rows, vocab, generator=g)
        top = x.max() + 1
        x[:, vocab // 2] = top  # a tie: the first wins
        x[:, vocab - 1] = top
        x[0, vocab // 3] = float("nan")  # NaN wins, the first one
        x[0, vocab - 2] = float("nan")
        x[-1] = float("-inf")
        for view in (x, x[:, :vocab - 1]):  # contiguous; rows a stride apart
            assert torch.equal(argmax_rows(view), view.argmax(-1)), (rows, vocab)
        assert argmax_rows(x)[-1] == 0 and (rows <= 2 or argmax_rows(x)[1] == vocab // 2)


def test_a_draft_from_a_sub_vocabulary_is_the_draft_from_the_whole_row():
    """draft_token over logits of a sub-vocabulary (a draft model's reduced LM head) gives the token, q
    and confidence it gives from the whole row with -inf elsewhere, ties included."""
    from specdecode.sampling import draft_token

    g = torch.Generator().manual_seed(3)
    V = 500
    for trial in range(40):
        ids = torch.randperm(V, generator=g)[:60].sort().values
        sub = (torch.randn(60, generator=g) * 3).round()  # rounded: ties between entries are common
        full = torch.full((V,), float("-inf")).index_copy_(0, ids, sub)
        for params in (SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=20, seed=1)):
            u = torch.rand(1, generator=g, dtype=torch.float64)
            p_min = [0.0, 0.3, 0.9][trial % 3]
            tok, q, conf = draft_token(sub, params, u, p_min, ids, V)
            want_tok, want_q, want_conf = draft_token(full, params, u, p_min)
            assert (tok, conf) == (want_tok, want_conf)
            assert (q is None) == (want_q is None) and (q is None or torch.equal(q, want_q))


def test_top_k():
    close(process_logits(LOGITS, SamplingParams(top_k=2)), renorm([0, 0, 0.30, 0, 0.40]))
    close(process_logits(LOGITS, SamplingParams(top_k=3)), renorm([0, 0.15, 0.30, 0, 0.40]))
    close(process_logits(LOGITS, SamplingParams(top_k=5)), PROBS)
    close(process_logits(LOGITS, SamplingParams(top_k=50)), PROBS)
    # Tie-inclusive: both tokens equal to the 2nd largest survive.
    close(process_logits(torch.tensor([[2.0, 1.0, 1.0, 0.0]]), SamplingParams(top_k=2)),
          renorm([math.e ** 2, math.e, math.e, 0]))


def test_top_p():
    # Sorted: 0.40, 0.30, 0.15, 0.10, 0.05. Keep while the mass before a token is < top_p.
    close(process_logits(LOGITS, SamplingParams(top_p=0.35)), [0, 0, 0, 0, 1])
    close(process_logits(LOGITS, SamplingParams(top_p=0.5)), renorm([0, 0, 0.30, 0, 0.40]))
    close(process_logits(LOGITS, SamplingParams(top_p=0.8)), renorm([0, 0.15, 0.30, 0, 0.40]))
    close(process_logits(LOGITS, SamplingParams(top_p=0.9)), renorm([0, 0.15, 0.30, 0.10, 0.40]))


def test_min_p():
    # Threshold = min_p · 0.40.
    close(process_logits(LOGITS, SamplingParams(min_p=0.3)), renorm([0, 0.15, 0.30, 0, 0.40]))  # 0.12
    close(process_logits(LOGITS, SamplingParams(min_p=0.2)), renorm([0, 0.15, 0.30, 0.10, 0.40]))  # 0.08
    close(process_logits(LOGITS, SamplingParams(min_p=1.0)), [0, 0, 0, 0, 1])


def test_filters_compose_in_order():
    # temperature 0.5 → ∝ p²: .0025 .0225 .09 .01 .16 (sum .285); top_k=4 drops .0025;
    # renormalised over .2825: .0796 .3186 .0354 .5664; top_p=0.85 keeps .5664, .3186 (mass before
    # the next is .885); min_p=0.6 then drops .3186 < .6·.5664.
    p = SamplingParams(temperature=0.5, top_k=4, top_p=0.85)
    close(process_logits(LOGITS, p), renorm([0, 0, 0.09, 0, 0.16]))
    close(process_logits(LOGITS, SamplingParams(temperature=0.5, top_k=4, top_p=0.85, min_p=0.6)), [0, 0, 0, 0, 1])


def _sorted_filters(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """top-k then top-p over a whole sort of the row (the plain definition), on scaled logits [V]."""
    vals, order = logits.sort(descending=True)
    if 0 < top_k < len(logits):
        logits = logits.masked_fill(logits < vals[top_k - 1], float("-inf"))
    probs = torch.softmax(logits, -1)
    if top_p < 1:
        sp = probs[order]
        before = torch.nn.functional.pad(sp.cumsum(-1)[:-1], (1, 0))
        probs = probs.masked_fill(probs < sp[int((before < top_p).sum()) - 1], 0.0)
    return probs / probs.sum()


@pytest.mark.parametrize("vocab", [151936, 3000, 40])
def test_top_k_and_top_p_read_only_the_head_yet_equal_a_whole_sort(vocab):
    """process_logits takes top-k's k-th value and top-p's prefix from a topk of a few hundred tokens,
    longer where a row's top-p mass lies further: bit for bit what the plain whole-row sort gives,
    for peaked, flat (the prefix runs past the first head) and tied rows, per-row settings mixed."""
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(vocab, generator=g) * s for s in (8.0, 2.0, 0.05)]  # peaked .. flat
    tied = torch.randn(vocab, generator=g)
    tied[: vocab // 2] = tied[0]
    rows += [tied, torch.round(torch.randn(vocab, generator=g) * 4) / 4]
    x = torch.stack(rows)
    settings = [(0.7, 0, 0.9), (1.0, 50, 1.0), (1.3, 3000, 0.999), (0.8, 40, 0.95), (1.0, 1, 0.5)]
    for t, k, p in settings:
        got = process_logits(x, SamplingParams(temperature=t, top_k=k, top_p=p))
        for row, want in zip(got, x):
            assert torch.equal(row, _sorted_filters(want / t, k, p)), (vocab, t, k, p)
    mixed = [SamplingParams(temperature=t, top_k=k, top_p=p) for t, k, p in settings]
    got = process_logits(x, mixed)
    for row, want, (t, k, p) in zip(got, x, settings):
        assert torch.equal(row, _sorted_filters(want / t, k, p)), (vocab, t, k, p)


def test_per_row_params_and_masked_logits():
    logits = torch.cat([LOGITS, LOGITS, torch.tensor([[0.0, float("-inf"), 1.0, float("-inf"), 0.0]])])
    params = [SamplingParams(temperature=0), SamplingParams(top_k=2), SamplingParams(top_p=0.6)]
    out = process_logits(logits, params)
    close(out[0], [0, 0, 0, 0, 1])
    close(out[1], renorm([0, 0, 0.30, 0, 0.40]))
    e = math.e
    close(out[2], renorm([1, 0, e, 0, 1]))  # e/(e+2) = .576 < .6, so both ties at 1/(e+2) stay
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError):
        process_logits(logits, params[:2])


def test_large_logits_and_tiny_temperature_are_safe():
    logits = torch.tensor([[1e4, -1e4, 9999.0, 0.0]])
    out = process_logits(logits, SamplingParams(temperature=1e-3, top_p=0.9, min_p=0.1))
    assert torch.isfinite(out).all()
    close(out, [1, 0, 0, 0])
    close(process_logits(logits, SamplingParams(temperature=1e-7)), [1, 0, 0, 0])  # below 1e-5: greedy
    assert process_logits(logits.half(), SamplingParams()).dtype == torch.float32


def test_sample_seed_reproducible_and_distribution():
    probs = process_logits(LOGITS.repeat(40_000, 1), SamplingParams())
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    c = sample(probs, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    freq = torch.bincount(a, minlength=5).float() / len(a)
    assert (freq - PROBS).abs().max() < 0.01  # 4+ standard deviations (sd ≤ .0025)


def test_sample_greedy_rows_and_zero_probabilities():
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.5, 0.0, 0.0, 0.5], [0.3, 0.7, 0.0, 0.0]]).repeat(2000, 1)
    out = sample(probs, torch.Generator().manual_seed(0)).reshape(2000, 3)
    assert (out[:, 0] == 2).all()
    assert set(out[:, 1].tolist()) == {0, 3}
    assert set(out[:, 2].tolist()) == {0, 1}  # trailing zeros are never reached


def test_native_sampling_is_the_pytorch_rule_bit_for_bit():
    """sample()'s native kernel gives the PyTorch rule's token on every row: processed rows of several
    vocabulary sizes (block tails), uniforms at the ends of [0, 1), u · total on a CDF step (the step's
    own index is not taken), one-positive and all-zero rows, rows picked by index, and rows with NaN,
    infinities or negative entries (left to PyTorch's path)."""
    from specdecode.sampling import _sample_rows

    if native_kernels() is None:
        pytest.skip("no native kernels here")
    g = torch.Generator().manual_seed(0)
    for vocab in (151936, 5000, 1024, 37, 3):
        logits = torch.randn(64, vocab, generator=g) * torch.rand(64, 1, generator=g) * 8
        params = [SamplingParams(temperature=0.3 + i % 5 / 4, top_k=[0, 1, 40][i % 3], top_p=[1.0, 0.9][i % 2])
                  for i in range(64)]
        probs = process_logits(logits, params)
        u = torch.rand(64, generator=g)
        u[:2] = torch.tensor([0.0, 1 - 2**-24])
        assert torch.equal(sample(probs, u=u), _sample_rows(probs, u)), vocab
        rows = torch.randint(0, 64, (16,), generator=g)
        assert torch.equal(sample(probs, u=u[:16], rows=rows), _sample_rows(probs[rows], u[:16]))
    # u · total landing exactly on a step: the first index whose CDF exceeds it
    steps = torch.tensor([[0.25, 0.25, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
    u = torch.tensor([0.5, 0.3, 0.9])
    assert sample(steps, u=u).tolist() == _sample_rows(steps, u).tolist() == [3, 3, 2]
    odd = torch.tensor([[0.2, float("nan"), 0.8], [0.5, float("inf"), 0.5], [0.7, -0.1, 0.4], [0.1, 0.2, 0.7]])
    u = torch.tensor([0.5, 0.5, 0.5, 0.5])
    assert torch.equal(sample(odd, u=u), _sample_rows(odd, u))


def test_stop_cut_and_earliest_end_wins():
    sc = StopChecker(("END", "\n\n"))
    assert sc.feed("hello END world") == "hello " and sc.matched == "END"
    assert sc.feed("more") == ""  # the text has ended
    # Both complete in one chunk: "c" ends first, so plain decoding would have stopped there.
    sc = StopChecker(("abcd", "c"))
    assert sc.feed("xabcd") == "xab" and sc.matched == "c"
    # Same end: the one starting first wins (cuts more).
    sc = StopChecker(("c", "bc"))
    assert sc.feed("abcx") == "a" and sc.matched == "bc"


def test_stop_partial_match_held_back():
    def released(text):
        return StopChecker(("</s>", "STOP")).feed(text)

    assert released("text </") == "text "  # "</" may become "</s>"
    assert released("text ST") == "text "
    assert released("text S!") == "text S!"
    assert released("") == ""
    sc = StopChecker(("</s>",))
    assert sc.feed("a</") == "a" and sc.flush() == "</" and sc.matched is None


def test_stop_across_chunks():
    sc = StopChecker(("<END>",))
    streamed = ""
    for chunk in ["Hi th", "ere <", "E", "ND> trailing"]:
        streamed += sc.feed(chunk)
        if sc.matched is not None:
            break
        assert "<" not in streamed  # the partial "<", "<E" was held back
    assert streamed == "Hi there " and sc.matched == "<END>"


def _stop_reference(text: str, stop: tuple[str, ...]) -> tuple[str, str | None]:
    """What checking the whole text after every character gives: the cut and the stop string."""
    for end in range(1, len(text) + 1):
        hits = [s for s in stop if s and text[:end].endswith(s)]
        if hits:
            s = max(hits, key=len)  # same end: the one starting first
            return text[:end - len(s)], s
    return text, None


def test_incremental_stop_check_matches_whole_text_scan():
    """Random texts over a small alphabet (so stop strings overlap themselves and each other), cut
    into random pieces: the incremental matcher releases exactly the whole-text answer, and never
    releases text that a later stop string then claims."""
    import random

    rng = random.Random(0)
    for _ in range(400):
        stop = tuple("".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 40)))
        sc, out, i = StopChecker(stop), "", 0
        while i < len(text) and sc.matched is None:
            n = rng.randint(0, 6)
            out += sc.feed(text[i:i + n])
            i += n
            assert _stop_reference(text, stop)[0].startswith(out)
        if sc.matched is None:
            out += sc.flush()
        assert (out, sc.matched) == _stop_reference(text, stop), (text, stop)


def test_a_sequence_cuts_at_a_stop_string_however_its_tokens_arrive():
    """Speculative steps append several tokens at once: the text, its streamed pieces and the
    finish reason are those of appending one token at a time, with stop strings straddling tokens."""
    import random

    from specdecode.engine.sequence import Sequence
    from specdecode.tokenizer.detok import StreamingDetokenizer
    from tiny_models import CharTokenizer

    tok, rng = CharTokenizer(100), random.Random(1)
    for _ in range(200):
        ids = tok.encode("".join(rng.choice("abc") for _ in range(30)))
        stop = tuple("".join(rng.choice("abc") for _ in range(rng.randint(2, 4))) for _ in range(2))
        runs = []
        for groups in ([1] * len(ids), [rng.randint(1, 5) for _ in ids]):
            seq = Sequence([0], SamplingParams(temperature=0, max_tokens=25, stop=stop), StreamingDetokenizer(tok),
                           frozenset())
            i, pieces = 0, []
            for g in groups:
                if seq.finished:
                    break
                pieces.append(seq.append(ids[i:i + g]))
                i += g
            assert "".join(pieces) == seq.text
            runs.append((seq.text, seq.finish_reason))
        assert runs[0] == runs[1], (tok.decode(ids), stop)
        assert runs[0][0] == _stop_reference(tok.decode(ids[:25]), stop)[0]


def test_extreme_but_valid_settings_run_in_a_batch():
    """The largest values validation lets through (top-k far past the vocabulary, a 64-bit seed)
    sample normally next to an ordinary request in one engine step."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_models import tiny_llm

    eng = tiny_llm("ngram", max_num_seqs=2).engine
    a = eng.add_request([1, 2, 3], SamplingParams(temperature=1.0, top_k=(1 << 31) - 1, seed=(1 << 64) - 1,
                                                  max_tokens=5, ignore_eos=True))
    b = eng.add_request([4, 5, 6], SamplingParams(temperature=0.7, seed=-(1 << 63), max_tokens=5, ignore_eos=True))
    while eng.has_work():
        eng.step()
    assert len(a.output_ids) == len(b.output_ids) == 5
