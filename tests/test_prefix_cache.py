"""Prefix caching: a request sharing a prefix with a finished one skips prefilling it, and greedy
output is token-identical with and without the cache, for plain and speculative decoding."""
import pytest
import torch

from specdecode import SamplingParams
from specdecode.runtime.kv_cache import KVCache
from specdecode.engine.prefix_cache import PrefixCache, common_prefix_len
from specdecode.engine.prompt_store import PromptStore
from specdecode.speculative.proposer import Proposer, Stash
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
    fed, prefilled = [], llm.engine._prefilled

    def spy(seq, end, states):
        fed.append(end - seq.num_prefilled)
        prefilled(seq, end, states)

    llm.engine._prefilled = spy
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


@pytest.mark.parametrize("spec_type,kw", [
    ("none", {}),
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)),
    ("ngram", {}),
])
def test_requests_arriving_together_prefill_a_shared_prompt_once(spec_type, kw):
    """A burst of prompts with one system prompt: the first prefills it, the others copy its entries
    (the last two need no forward at all), and every output is what it is without a prefix cache."""
    prompts = [SYSTEM + [11, 12, 13], SYSTEM + [21, 22], SYSTEM + [31], SYSTEM + [11, 12, 13]]
    ref = [o.token_ids for o in no_cache(spec_type, max_num_seqs=4, **kw).generate(prompts, GREEDY)]
    llm = tiny_llm(spec_type, max_num_seqs=4, **kw)
    fed = count_prefill(llm)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == ref
    assert sorted(fed) == [1, len(prompts[0]) - 1]  # the first prompt whole, then the second's [21]
    assert llm.engine.prefix_cache.hit_tokens == 2 * len(SYSTEM) + len(prompts[3]) - 1


@pytest.mark.parametrize("spec_type", ["draft", "ngram,draft"])
def test_the_draft_model_copies_a_running_requests_entries(spec_type):
    """In a burst with one system prompt the draft model, too, prefills the shared prefix once: the
    others copy the first request's draft entries and feed only their own tokens."""
    kw = dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)
    prompts = [SYSTEM + [11, 12, 13], SYSTEM + [21, 22], SYSTEM + [31], SYSTEM + [11, 12, 13]]
    ref = [o.token_ids for o in no_cache(spec_type, max_num_seqs=4, **kw).generate(prompts, GREEDY)]
    llm = tiny_llm(spec_type, max_num_seqs=4, **kw)
    prop = llm.engine.proposer
    prop = next(m for m in prop.members if m.name == "draft") if hasattr(prop, "members") else prop
    rows, forward = [], prop.runner.forward

    def spy(slots, tokens, *a, **kw):
        rows.extend(map(len, tokens))
        return forward(slots, tokens, *a, **kw)

    prop.runner.forward = spy
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == ref
    assert [n for n in rows if n > 1 + 4] == [len(prompts[0]) - 1]  # beyond it: [21], roots and drafts


def test_a_request_joining_running_ones_copies_their_prompt():
    """A prompt admitted while another request decodes takes the prefix that request's slot holds,
    though the slot is not free; the donor's own output does not change."""
    a, b = SYSTEM + [11, 12, 13], SYSTEM[:100] + [41, 42]
    ref = [o.token_ids for o in no_cache(max_num_seqs=2).generate([a, b], GREEDY)]
    llm = tiny_llm("none", max_num_seqs=2)
    eng, fed = llm.engine, count_prefill(llm)
    sa = eng.add_request(a, GREEDY)
    for _ in range(3):
        eng.step()
    sb = eng.add_request(b, GREEDY)
    while eng.has_work():
        eng.step()
    assert [sa.output_ids, sb.output_ids] == ref
    assert fed == [len(a) - 1, 1]  # b prefills [41] only: 100 system tokens copied, 42 is its root
    assert eng.prefix_cache.hit_tokens == 100


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
    eng.planner.calibrated = False  # calibrate again now that both free slots hold cached prefixes
    llm.generate([5, 6, 7], GREEDY)  # calibration overwrites a free slot; the request takes one
    out = llm.generate(c, GREEDY)[0].token_ids
    assert out == no_cache("ngram").generate(c, GREEDY)[0].token_ids


def test_slot_order_and_bookkeeping():
    kv = KVCache(1, 3, 32, 1, 4, torch.float32)
    pc = PrefixCache(kv)
    slot, reused, kept, _ = pc.allocate([1, 2, 3])
    assert (slot, reused, kept) == (0, 0, 0) and kv.free_slots == 2
    kv.set_length(slot, 5)
    pc.release(slot, [1, 2, 3, 4])  # committed entries beyond the tokens are not trusted
    kv.free(slot)
    assert pc.cached[0] == [1, 2, 3, 4]
    assert pc.allocate([9]) == (1, 0, 0, None)  # a miss takes a never-used slot before a cached one
    assert pc.allocate([1, 2, 3, 4, 5]) == (0, 4, 4, None) and kv.lengths[0] == 4
    assert pc.allocate([1, 2]) == (2, 0, 0, None)
    assert common_prefix_len([1, 2, 3], [1, 2]) == 2 and common_prefix_len([], [1]) == 0


# -- the host prompt store (--cache-ram) ---------------------------------------------------------------
def _kv(n, fill):
    return torch.full((2, 1, n, 4), float(fill)), torch.full((2, 1, n, 4), -float(fill))


def test_prompt_store_keeps_the_longest_and_evicts_the_oldest():
    per_token = 2 * 2 * 1 * 4 * 4  # k and v, 2 layers, 1 head, 4 dims, float32
    store = PromptStore(budget_bytes=10 * per_token)
    store.add([1, 2, 3], *_kv(3, 1))
    store.add([1, 2], *_kv(2, 9))  # held whole by [1, 2, 3]: not kept
    assert len(store) == 1 and store.match([1, 2, 7]) == (0, 2)
    store.add([1, 2, 3, 4], *_kv(4, 2))  # holds [1, 2, 3] whole: replaces it
    assert len(store) == 1 and store.bytes == 4 * per_token
    key, n = store.match([1, 2, 3, 4, 5])
    k, v, stash = store.take(key, n)
    assert n == 4 and k.shape == (2, 1, 4, 4) and float(k[0, 0, 0, 0]) == 2 and store.hit_tokens == 4
    assert stash is None
    store.add([5, 6, 7, 8], *_kv(4, 3), Stash("a drafter's state", per_token))  # its bytes count
    store.add([6, 6, 6], *_kv(3, 4))  # 12 tokens' worth: the least recently used entry goes
    assert store.match([1, 2, 3, 4]) == (-1, 0) and store.match([5, 6, 7])[1] == 3
    assert store.bytes == 8 * per_token
    assert store.take(*store.match([5, 6, 7]))[2] == Stash("a drafter's state", per_token)
    store.add(list(range(11)), *_kv(11, 5))  # larger than the whole budget: not kept
    assert store.bytes == 8 * per_token


def test_prefix_cache_spills_a_slot_to_the_store_before_overwriting_it():
    """A slot's tokens go to the store with the drafter's stash of the state it kept for them, which
    comes back with a store hit."""

    class Stashing(Proposer):
        def stash(self, slot):
            return Stash(("kept under", slot), 8)

    kv = KVCache(2, 1, 32, 1, 4, torch.float32)
    pc = PrefixCache(kv, PromptStore(2**20))
    slot, *_ = pc.allocate([1, 2, 3, 4])
    kv.write(0, *[torch.arange(16.).reshape(1, 1, 4, 4)] * 2, [slot], [0], [4], 4)
    kv.write(1, *[torch.arange(16.).reshape(1, 1, 4, 4) + 100] * 2, [slot], [0], [4], 4)
    kv.set_length(slot, 4)
    saved = kv.k[:, slot, :, :4].clone()
    pc.release(slot, [1, 2, 3, 4])
    kv.free(slot)
    assert pc.allocate([1, 2, 9], Stashing()) == (0, 2, 2, None)  # the slot serves 2 tokens, then is overwritten...
    assert pc.store.match([1, 2, 3, 4, 5])[1] == 4  # ...so its 4 tokens went to the store first
    kv.k[:, slot] = 0
    kv.set_length(slot, 3)
    pc.release(slot, [1, 2, 9])
    kv.free(slot)
    # the slot holds 2 of [1, 2, 3, 4, 5], the store 4: the store's entries come back, in place
    assert pc.allocate([1, 2, 3, 4, 5]) == (0, 4, 0, Stash(("kept under", 0), 8))
    assert torch.equal(kv.k[:, slot, :, :4], saved) and kv.lengths[slot] == 4
    assert pc.hit_tokens == 2 + 4 and pc.store.hit_tokens == 4
    # the slot ends holding what the store's entry holds: overwriting it copies nothing to the store
    pc.release(slot, [1, 2, 3, 4])
    kv.free(slot)
    stashed = []

    class Counting(Proposer):
        def stash(self, slot):
            stashed.append(slot)

    read, held = kv.read, (len(pc.store), pc.store.bytes)  # [1, 2, 3, 4] and [1, 2, 9]
    kv.read = lambda *a: pytest.fail("read a slot the store already holds")
    assert pc.allocate([7, 8], Counting()) == (0, 0, 0, None)
    kv.read = read
    assert not stashed and (len(pc.store), pc.store.bytes) == held and pc.store.match([1, 2, 3, 4])[1] == 4


@pytest.mark.parametrize("spec_type,kw", [
    ("none", {}),
    ("draft", dict(draft_seed=0, draft_noise=0.5, draft_p_min=0.0, draft_fixed=True, draft_max=4)),
    ("ngram", {}),
])
def test_more_conversations_than_slots_come_back_from_the_store(spec_type, kw):
    """Three chats on two slots: a chat's second turn finds its slot taken by another chat, and the
    store gives back its first turn's prompt and answer; outputs equal those without any cache."""
    llm = tiny_llm(spec_type, max_num_seqs=2, **kw)
    fed = count_prefill(llm)
    ref = no_cache(spec_type, **kw)
    firsts = [SYSTEM[i * 40:i * 40 + 40] + [200 + i] for i in range(3)]
    answers = [llm.generate(p, GREEDY)[0].token_ids for p in firsts]
    seconds = [p + a + [31, 32] for p, a in zip(firsts, answers)]
    fed.clear()
    out = llm.generate(seconds[0], GREEDY)[0].token_ids  # chat 0's slot now holds chat 2's first turn
    # the store held chat 0's prompt and all but the last answer token (never fed to the target): that
    # token and the question's first are prefilled, its last is the first draft root
    assert llm.engine.prefix_cache.store.hit_tokens == len(firsts[0]) + len(answers[0]) - 1
    assert sum(fed) == 2
    assert out == ref.generate(seconds[0], GREEDY)[0].token_ids
    for p, a in zip(firsts, answers):
        assert a == ref.generate(p, GREEDY)[0].token_ids


def test_cache_ram_zero_keeps_prompts_only_in_their_slots():
    llm = tiny_llm("none", max_num_seqs=1, prompt_cache_mib=0)
    a, b = SYSTEM[:50] + [1], SYSTEM[50:100] + [2]
    llm.generate(a, GREEDY)
    llm.generate(b, GREEDY)
    fed = count_prefill(llm)
    llm.generate(a, GREEDY)
    assert llm.engine.prefix_cache.store is None and sum(fed) == len(a) - 1


def test_a_negative_cache_ram_is_one_clear_error():
    from specdecode.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="--cache-ram must be >= 0"):
        tiny_llm("none", prompt_cache_mib=-1)


def test_reset_prefix_cache_forgets_slots_and_store():
    llm = tiny_llm("none", max_num_seqs=1)
    a, b = SYSTEM[:50] + [1], SYSTEM[50:100] + [2]
    out = llm.generate(a, GREEDY)[0].token_ids
    llm.generate(b, GREEDY)  # a's KV goes to the store, b's stays in the slot
    assert len(llm.engine.prefix_cache.store) == 1
    assert llm.reset_prefix_cache()
    fed = count_prefill(llm)
    assert llm.generate(a, GREEDY)[0].token_ids == out and sum(fed) == len(a) - 1
    fed.clear()
    llm.generate(b, GREEDY)
    assert sum(fed) == len(b) - 1
    assert not no_cache().reset_prefix_cache()
