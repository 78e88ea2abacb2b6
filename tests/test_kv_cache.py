"""KV-cache semantics the speculative layer relies on: one code path for prefill / decode / verify,
O(1) rollback, tree verification, and a cache that after many accept/reject steps equals a fresh
prefill of the committed tokens."""
import pytest
import torch

from specdecode import SamplingParams
from specdecode.runtime.kv_cache import KVCache
from specdecode.errors import OutOfMemoryBudgetError
from specdecode.speculative.tree import DraftTree
from tiny_models import hf_model, ours_from_hf, tiny_llm

ATOL = 1e-9  # float64 throughout: different summation orders agree to ~1e-13


@pytest.fixture(scope="module")
def runner():
    return ours_from_hf(hf_model("qwen2", dtype=torch.float64), dtype=torch.float64)


def _ids(n, seed=0):
    return torch.randint(0, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_equals_single_steps(runner):
    ids = _ids(24)
    a, b = runner.kv.allocate(), runner.kv.allocate()
    full, _, _ = runner.forward([a], [ids])
    steps = []
    for i, t in enumerate(ids):
        lg, _, _ = runner.forward([b], [[t]])
        runner.kv.set_length(b, i + 1)
        steps.append(lg[0, 0])
    torch.testing.assert_close(full[0], torch.stack(steps), rtol=0, atol=ATOL)
    runner.kv.free(a), runner.kv.free(b)


def test_truncate_and_refeed(runner):
    ids, other = _ids(20, 1), _ids(7, 2)
    s = runner.kv.allocate()
    runner.forward([s], [ids[:12]])
    runner.kv.set_length(s, 12)
    runner.forward([s], [other])  # rejected tokens: written past the committed length...
    runner.kv.set_length(s, 19)
    runner.kv.set_length(s, 12)  # ...and rolled back in O(1)
    after, _, _ = runner.forward([s], [ids[12:]])
    fresh = runner.kv.allocate()
    ref, _, _ = runner.forward([fresh], [ids])
    torch.testing.assert_close(after[0], ref[0, 12:], rtol=0, atol=ATOL)
    runner.kv.free(s), runner.kv.free(fresh)


def test_batched_rows_match_single(runner):
    """Rows of different lengths and cache fills in one forward give each row's solo logits."""
    a, b = runner.kv.allocate(), runner.kv.allocate()
    runner.forward([a], [_ids(9, 3)])
    runner.kv.set_length(a, 9)
    new_a, new_b = _ids(3, 4), _ids(6, 5)
    lg, _, _ = runner.forward([a, b], [new_a, new_b])
    solo_a, _, _ = runner.forward([a], [new_a])
    solo_b, _, _ = runner.forward([b], [new_b])
    torch.testing.assert_close(lg[0, :3], solo_a[0], rtol=0, atol=ATOL)
    torch.testing.assert_close(lg[1, :6], solo_b[0], rtol=0, atol=ATOL)
    runner.kv.free(a), runner.kv.free(b)


def test_tree_verify_matches_chains_and_commit(runner):
    """One tree forward gives every node the logits of its own root-to-node chain; committing a
    path by moving its entries leaves the cache equal to a fresh prefill."""
    prefix = _ids(10, 6)
    # root children: 0, 1; node 2 under 0; node 3 under 2; node 4 under 1
    tree = DraftTree([11, 12, 13, 14, 15], [-1, -1, 0, 2, 1])
    s = runner.kv.allocate()
    runner.forward([s], [prefix[:-1]])
    runner.kv.set_length(s, 9)
    L = 9
    toks = [[prefix[-1]] + tree.tokens]
    pos = [[L + d for d in [0] + tree.depths()]]
    lg, _, _ = runner.forward([s], toks, pos, tree_mask=tree.attention_mask().unsqueeze(0))
    paths = {0: [11], 1: [12], 2: [11, 13], 3: [11, 13, 14], 4: [12, 15]}
    for node, path in paths.items():
        c = runner.kv.allocate()
        ref, _, _ = runner.forward([c], [prefix + path])
        torch.testing.assert_close(lg[0, node + 1], ref[0, -1], rtol=0, atol=ATOL)
        runner.kv.free(c)
    # accept path 0 -> 2 -> 3: move entries L+1+[0, 2, 3] to L+1.., commit, compare with fresh prefill
    runner.kv.move(s, [L + 1 + p for p in (0, 2, 3)], L + 1)
    runner.kv.set_length(s, L + 4)
    nxt, _, _ = runner.forward([s], [[99]])
    c = runner.kv.allocate()
    ref, _, _ = runner.forward([c], [prefix + [11, 13, 14, 99]])
    torch.testing.assert_close(nxt[0, 0], ref[0, -1], rtol=0, atol=ATOL)
    runner.kv.free(s), runner.kv.free(c)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cache_after_many_spec_steps_equals_fresh_prefill(temperature):
    llm = tiny_llm("draft", draft_seed=0, draft_noise=0.5, draft_fixed=True, draft_max=4, draft_p_min=0.0)
    eng = llm.engine
    seq = eng.add_request(_ids(8, 8), SamplingParams(temperature=temperature, max_tokens=200, seed=1,
                                                     ignore_eos=True))
    for _ in range(30):
        eng.step()
    assert seq.stats.draft_tokens > seq.stats.accepted_tokens > 0  # both accepts and rejects happened
    L = eng.kv.lengths[seq.slot]
    assert L == seq.num_tokens - 1
    fresh = eng.kv.allocate()
    eng.runner.forward([fresh], [seq.tokens[:-1]])
    for cache in (eng.kv.k, eng.kv.v):
        torch.testing.assert_close(cache[:, seq.slot, :, :L], cache[:, fresh, :, :L], rtol=0, atol=ATOL)
    # and the draft model's cache equals a fresh prefill of what it claims to hold
    prop = eng.proposer
    dslot, dlen = seq.draft_state.slot, seq.draft_state.length
    assert seq.draft_state.skipped == 0  # it drafted every step: never idle, nothing skipped
    dfresh = prop.kv.allocate()
    prop.runner.forward([dfresh], [seq.tokens[:dlen]])
    torch.testing.assert_close(prop.kv.k[:, dslot, :, :dlen], prop.kv.k[:, dfresh, :, :dlen], rtol=0, atol=ATOL)


def test_idle_draft_model_catches_up_on_the_last_tokens_only():
    """After k = 0 steps the draft model feeds only the last CATCH_UP pending tokens, at their true
    positions: its cache is then what it held plus those tokens, it drafts what that context predicts,
    and the output stays token-identical to plain greedy decoding."""
    from specdecode.speculative.draft_model import CATCH_UP

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompt = _ids(8, 8)
    plain = tiny_llm().generate(prompt, params)[0].token_ids
    llm = tiny_llm("draft", draft_seed=0, draft_noise=0.3, draft_max=3, draft_p_min=0.0)
    eng, prop = llm.engine, llm.engine.proposer
    seq = eng.add_request(prompt, params)
    eng._draft_lengths = lambda seqs, merged=False: [0] * len(seqs)  # the controller keeps the draft idle for 10 steps
    for _ in range(10):
        eng.step()
    del eng._draft_lengths
    st = seq.draft_state
    held, n = st.length, len(seq.tokens)
    assert n - held > CATCH_UP
    tree = prop.propose([seq], [3])[0]
    assert st.skipped == n - held - CATCH_UP
    # reference: a fresh slot fed what the draft held, then the last CATCH_UP tokens at their positions
    ref = prop.kv.allocate()
    prop.runner.forward([ref], [seq.tokens[:held]], logits=False)
    prop.kv.set_length(ref, held)
    feed, pos, expect = seq.tokens[-CATCH_UP:], n - CATCH_UP, []
    for _ in range(3):
        logits = prop.runner.forward([ref], [feed], [range(pos, pos + len(feed))], last_only=True)[0]
        prop.kv.set_length(ref, prop.kv.lengths[ref] + len(feed))
        pos += len(feed)
        feed = [int(logits[0].argmax())]
        expect.append(feed[0])
    assert tree.tokens == expect
    L = held + CATCH_UP
    dslot = st.slot
    torch.testing.assert_close(prop.kv.k[:, dslot, :, :L], prop.kv.k[:, ref, :, :L], rtol=0, atol=ATOL)
    prop.kv.free(ref)
    prop.commit(seq, 0, None)  # the probe above ran outside the engine: roll it back as a full rejection
    while not seq.finished:
        eng.step()
    assert seq.output_ids == plain


def test_budget_sizing_and_clear_error():
    kv = KVCache.from_budget(2**20, num_slots=2, max_len=10_000, num_layers=2, num_kv_heads=2, head_dim=16,
                             dtype=torch.float32)
    per_tok = KVCache.bytes_per_token(2, 2, 16, torch.float32)
    assert kv.max_len == 2**20 // (per_tok * 2)
    with pytest.raises(OutOfMemoryBudgetError, match="cannot hold"):
        KVCache.from_budget(1000, 2, 10_000, 2, 2, 16, torch.float32)
    s = kv.allocate()
    with pytest.raises(OutOfMemoryBudgetError, match="KV cache holds"):
        kv.check_fits(s, kv.max_len + 1)


@pytest.mark.parametrize("budget", [0, 5])
@pytest.mark.parametrize("spec_type,temperature", [("none", 0.0), ("ngram", 0.0), ("ngram", 0.8)])
def test_a_new_prompt_prefills_within_the_step_budget_while_others_decode(budget, spec_type, temperature):
    """While a request decodes, a new request's prompt advances by at most max_prefill_tokens a step
    (0: one prefill_chunk per prompt and step), its chunks riding in the decoder's verify forward (drafts
    too); with nothing decoding, prompts prefill a whole chunk. Outputs are those of each request alone
    and without speculation (greedy, and seeded sampling)."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    params = SamplingParams(temperature=temperature, seed=3, max_tokens=12, ignore_eos=True)
    first, second = [3, 4, 5, 6] * 5, [7, 8, 9] * 9
    alone = [tiny_llm().generate(p, params)[0].token_ids for p in (first, second)]
    llm = tiny_llm(spec_type, max_prefill_tokens=budget, prefill_chunk=16)
    eng = llm.engine
    a = eng.add_request(first, params)
    eng.step()  # nothing decodes yet: the first prompt takes its chunk of 16 (of 19 to prefill)
    assert a.num_prefilled == 16
    eng.step()
    assert a.num_prefilled == len(first) - 1 and a.output_ids
    b = eng.add_request(second, params)
    steps, forwards, forward = [], [], eng.runner.forward
    eng.runner.forward = lambda *a, **kw: forwards.append(len(a[0])) or forward(*a, **kw)
    while b.num_prefilled < len(second) - 1:
        before = b.num_prefilled
        eng.step()
        steps.append(b.num_prefilled - before)
    eng.runner.forward = forward
    assert steps == ([5, 5, 5, 5, 5, 1] if budget else [16, 10])
    # one forward a step for both requests with a budget; else the prompt's own, then the decoders' (the
    # prompt's last chunk done, it decodes in that step already)
    assert forwards == ([2] * 6 if budget else [1, 1, 1, 2])
    while not (a.finished and b.finished):
        eng.step()
    assert [a.output_ids, b.output_ids] == alone


def test_a_burst_of_prompts_prefills_at_once_beside_fewer_decoders():
    """--max-prefill-tokens caps prompts only while at least as many requests decode as prompts wait: a
    burst that outnumbers the decoders prefills whole chunks at once (throttled, it would keep many
    requests waiting to spare a few a stall); once decoders are as many, a joining prompt is capped."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    eng = tiny_llm(max_prefill_tokens=5, prefill_chunk=16, max_num_seqs=4).engine
    a = eng.add_request([3, 4, 5, 6] * 5, params)
    while not eng._decoding(a):
        eng.step()
    b, c = eng.add_request([7, 8, 9] * 9, params), eng.add_request([9, 8, 7] * 9, params)
    eng.step()
    assert (b.num_prefilled, c.num_prefilled) == (16, 16)  # two prompts against one decoder: uncapped
    eng.step()
    assert eng._decoding(b) and eng._decoding(c)
    d = eng.add_request([1, 2] * 10, params)
    eng.step()
    assert d.num_prefilled == 5  # three decoders, one prompt: capped
