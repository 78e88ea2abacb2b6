"""Prefix caching: a request sharing a prefix with a finished one skips prefilling it, and greedy
output is token-identical with and without the cache, for plain and speculative decoding."""
import pytest
import torch

from specdecode import SamplingParams
from specdecode.runtime.kv_cache import KVCache
from specdecode.engine.prefix_cache import PrefixCache, common_prefix_len
from tiny_models import tiny_llm

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
SYSTEM = [(7 * i) % 300 + 1 for i in range(150)]  # a long shared "system prompt"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls on a loaded 2-core machine: a second thread makes them 100x slower
    yield
    torch.set_num_threads(n)


def no_cache(spec_type="none", **kw):
    return tiny_llm(spec_type, enable_prefix_caching=False, **kw)


def count_prefill(llm) -> list[int]:
    """Records the prompt tokens of every prefill chunk the engine runs."""
    fed, chunk = [], llm.engine._prefill_chunk

    def spy(seq):
        before = seq.num_prefilled
        chunk(seq)
        fed.append(seq.num_prefilled - before)

    llm.engine._prefill_chunk = spy
    return fed


@pytest.mark.parametrize("spec_type,kw", [
    ("none", {}),
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)),
    ("ngram", {}),
])
def test_shared_system_prompt(spec_type, kw):
    prompts = [SYSTEM + [11, 12, 13], SYSTEM + [21, 22], SYSTEM + [21, 22]]
    ref = [no_cache(spec_type, **kw).generate(p, GREEDY)[0].token_ids for p in prompts]
    llm = tiny_llm(spec_type, **kw)
    fed = count_prefill(llm)
    pc = llm.engine.prefix_cache
    outs, prefilled = [], []
    for p in prompts:
        before = len(fed)
        outs.append(llm.generate(p, GREEDY)[0].token_ids)
        prefilled.append(sum(fed[before:]))
    assert outs == ref
    assert prefilled[0] == len(prompts[0]) - 1  # a cold cache prefills all but the last prompt token (the root)
    assert prefilled[1] == 2 - 1  # only the new question
    assert prefilled[2] == 0  # the same prompt again: all reused
    assert pc.hit_tokens == len(SYSTEM) + len(prompts[2]) - 1


def test_multi_turn_reuses_prompt_and_answer():
    llm = tiny_llm("none")
    turn1 = SYSTEM + [11, 12]
    out1 = llm.generate(turn1, GREEDY)[0].token_ids
    turn2 = turn1 + out1 + [31, 32, 33]
    out2 = llm.generate(turn2, GREEDY)[0].token_ids
    # the slot holds turn 1's prompt and all but the last answer token (never fed to the target)
    assert llm.engine.prefix_cache.hit_tokens == len(turn1) + len(out1) - 1
    assert out2 == no_cache().generate(turn2, GREEDY)[0].token_ids


def test_draft_model_keeps_its_entries_of_the_shared_prefix():
    """The draft model's cache entries for the tokens a prefix-cache hit shares are kept with the slot:
    the same prompt again prefills nothing in the draft, the chat's next turn only its new tokens."""
    kw = dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)
    llm = tiny_llm("draft", **kw)
    prop = llm.engine.proposer
    fed, forward = [], prop.runner.forward

    def spy(slots, tokens, *a, **kw):
        fed.append(sum(map(len, tokens)))
        return forward(slots, tokens, *a, **kw)

    prop.runner.forward = spy
    ref = no_cache("draft", **kw)
    turn1 = SYSTEM + [11, 12]
    out1 = llm.generate(turn1, GREEDY)[0]
    assert max(fed) == len(turn1) - 1  # the cold prompt, prefilled in the draft
    fed.clear()
    again = llm.generate(turn1, GREEDY)[0]
    assert max(fed) <= 1 + 4  # drafting only: the root, then one token per draft
    turn2 = turn1 + out1.token_ids + [31, 32, 33]
    fed.clear()
    out2 = llm.generate(turn2, GREEDY)[0]
    # the question and the answer's last token (never fed to the target), and at most one token before
    # it that the draft had not fed yet (its last step's bonus token)
    assert fed[0] <= 3 + 1
    for p, out in ((turn1, out1), (turn1, again), (turn2, out2)):
        want = ref.generate(p, GREEDY)[0]
        assert out.token_ids == want.token_ids
        assert out.stats["spec"]["accepted_tokens"] == want.stats["spec"]["accepted_tokens"]


def test_picks_the_best_matching_slot():
    llm = tiny_llm("none", max_num_seqs=2)
    a, b = SYSTEM[:60] + [1], SYSTEM[60:120] + [2]
    llm.generate([a, b], GREEDY)  # both slots now cached, a and b
    pc = llm.engine.prefix_cache
    slot_of = {tuple(v[:61]): s for s, v in pc.cached.items()}
    seq = llm.engine.add_request(a[:-1] + [3], GREEDY)
    llm.engine.step()
    assert seq.slot == slot_of[tuple(a)] and pc.hit_tokens == 60


def test_aborted_prefill_is_reused():
    prompt = SYSTEM + SYSTEM[:100]
    llm = tiny_llm("none", prefill_chunk=64)
    seq = llm.engine.add_request(prompt, GREEDY)
    llm.engine.step()  # one 64-token chunk
    llm.engine.abort(seq)
    out = llm.generate(prompt, GREEDY)[0].token_ids
    assert llm.engine.prefix_cache.hit_tokens == 64
    assert out == no_cache().generate(prompt, GREEDY)[0].token_ids


def test_calibration_slot_is_not_reused():
    """The cost calibration writes into a free slot: whatever that slot had cached must be forgotten."""
    llm = tiny_llm("ngram", max_num_seqs=2, prefill_chunk=64)
    eng = llm.engine
    a, c = SYSTEM + [1], SYSTEM[::-1] + [2]
    for p in (a, c):  # both slots get a cached prefix before the first decode step calibrates
        seq = eng.add_request(p, GREEDY)
        eng.step()
        eng.abort(seq)
    assert len(eng.prefix_cache.cached) == 2
    eng._calibrated = False  # calibrate again now that both free slots hold cached prefixes
    llm.generate([5, 6, 7], GREEDY)  # calibration overwrites a free slot; the request takes one
    out = llm.generate(c, GREEDY)[0].token_ids
    assert out == no_cache("ngram").generate(c, GREEDY)[0].token_ids


def test_slot_order_and_bookkeeping():
    kv = KVCache(1, 3, 32, 1, 4, torch.float32)
    pc = PrefixCache(kv)
    slot, reused = pc.allocate([1, 2, 3])
    assert (slot, reused) == (0, 0) and kv.free_slots == 2
    kv.set_length(slot, 5)
    pc.release(slot, [1, 2, 3, 4])  # committed entries beyond the tokens are not trusted
    kv.free(slot)
    assert pc.cached[0] == [1, 2, 3, 4]
    assert pc.allocate([9]) == (1, 0)  # a miss takes a never-used slot before a cached one
    assert pc.allocate([1, 2, 3, 4, 5]) == (0, 4) and kv.lengths[0] == 4
    assert pc.allocate([1, 2]) == (2, 0)
    assert common_prefix_len([1, 2, 3], [1, 2]) == 2 and common_prefix_len([], [1]) == 0
