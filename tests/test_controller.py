"""The draft-length cost model: drafts when verifying is cheap and acceptance high, stops when not."""
from specdecode.speculative.controller import AcceptanceEstimate, CostModel, choose_batch_draft_length



def choose_draft_length(alphas, draft_cost, verify_cost, k_max, k_min=0):
    """One sequence: a batch of one."""
    return choose_batch_draft_length([alphas], draft_cost, verify_cost, k_max, k_min)


def test_choice_follows_costs_and_acceptance():
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__  # int4 verify curve measured here
    assert choose_draft_length([0.9] * 4, 0.0, v, 4) == 3  # free drafts, high acceptance
    assert choose_draft_length([0.1] * 4, 0.0, v, 4) == 0  # unpredictable text
    assert choose_draft_length([0.9] * 4, 0.95, v, 4) == 0  # a draft as slow as the target never pays
    assert choose_draft_length([0.9] * 4, 0.0, v, 4, k_min=4) in (0, 4)


def test_a_one_off_catch_up_cost_must_be_covered_by_the_step():
    """A drafter that must first catch up (a head feeding the entries it skipped) drafts only where the
    step's expected gain covers that cost, spread over CATCH_UP_STEPS steps: E(k)/(v(k + 1) + c / 8)
    against 1/v(1)."""
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__
    sure, fair = [0.9] * 4, [0.5] * 4
    assert choose_batch_draft_length([fair], 0.0, v, 4) == 1  # 1.5 / 1.18 = 1.27 per unit of v(1)
    assert choose_batch_draft_length([fair], 0.0, v, 4, catch_up=8 * 0.5) == 0  # 1.5 / 1.68, 1.75 / 1.88 < 1
    assert choose_batch_draft_length([sure], 0.0, v, 4, catch_up=8 * 0.5) == 3  # 3.44 / 2.2 = 1.56


def test_batch_shares_one_draft_length():
    """A batch verifies in one forward padded to its longest draft, so the length is chosen for the
    batch: sum of expected tokens over the shared cost."""
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__
    sure, hopeless = [0.9] * 4, [0.0] * 4
    assert choose_draft_length(sure, 0.0, v, 4) == 3  # alone: E(3)/v(4) = 3.44/1.7 beats 2.71/1.38
    # with a sequence that gains nothing from drafting, k = 3 costs both of them v(4): (3.44 + 1)/1.7
    # = 2.61 < (2.71 + 1)/1.38 = 2.69
    assert choose_batch_draft_length([sure, hopeless], 0.0, v, 4) == 2
    assert choose_batch_draft_length([sure, sure], 0.0, v, 4) == 3  # same as alone
    assert choose_batch_draft_length([hopeless, hopeless], 0.0, v, 4) == 0
    # a sequence with room for one draft only counts its one position
    assert choose_batch_draft_length([[0.9], [0.9]], 0.0, v, 4) == 1


def test_no_draft_longer_than_any_estimate_reaches():
    """A length past every sequence's estimates gains nothing, so it is never chosen, even where a
    noisy cost curve prices it lower; and the lengths past them are not priced at all (a chain's cap
    is the longest drafter's, 24 for suffix, and the batch is planned every step)."""
    priced = []

    def v(t):
        priced.append(t)
        return {1: 1.0, 2: 1.18, 3: 1.38}.get(t, 1.1)  # longer shapes noisily cheap

    assert choose_batch_draft_length([[0.9, 0.9], [0.5]], 0.0, v, 24) == 2
    assert max(priced) == 3
    priced.clear()
    assert choose_batch_draft_length([[], []], 0.0, v, 24) == 0  # nothing estimated: nothing to draft
    assert max(priced) <= 2


def test_cost_model_keys_shapes_by_rows():
    """A packed ragged batch is observed at its real row count, and priced there."""
    c = CostModel()
    c.observe(4, 4, 0.1)  # plain decoding of four sequences
    c.observe(4, 12, 0.2)  # four sequences, 8 draft tokens among them
    assert c.verify_cost(4, 1) == 0.1 and c.verify_cost(4, 3) == 0.2
    assert abs(c.rows_cost(4, 8) - 0.15) < 1e-12


def never_drafting_llm(spec_type: str = "ngram-simple"):
    """A tiny engine whose drafter never drafts, on a fixed cost curve instead of timings (a loaded
    machine would make measured ones anything), with the speculation gate held open (these test the
    controller's records; the gate, which closes after idle steps, has its own tests below);
    ``asked`` records each proposal's cap."""
    from specdecode.speculative.tree import DraftTree
    from tiny_models import tiny_llm

    llm = tiny_llm(spec_type, draft_max=3, **({"draft_seed": 0} if spec_type == "draft" else {}))
    eng = llm.engine
    eng.planner.calibrated = True
    eng.planner.costs.observe = lambda *a: None
    eng.planner.costs.verify_cost = lambda batch, t: 1.0 + 0.5 * (t - 1)
    eng.planner.gate.open = lambda batch: True
    asked = []
    eng.proposer.propose = lambda seqs, ks: asked.append(ks[0]) or [DraftTree.empty() for _ in seqs]
    return llm, asked


def test_positions_asked_but_not_drafted_count_as_misses():
    """An n-gram proposer with no match (or a draft stopped by --draft-p-min) returns fewer tokens
    than asked: those positions gained nothing (and cost padded rows in a batch), so the estimate
    falls as for a rejection, and the controller stops asking."""
    from specdecode import SamplingParams
    from specdecode.speculative.controller import PRIOR_ALPHA

    llm, asked = never_drafting_llm()
    eng = llm.engine
    seq = eng.add_request(list(range(5, 25)), SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    while not seq.finished:
        eng.step()
    assert asked and asked[0] > 0  # the optimistic prior asks at first
    assert seq.acceptance.alphas(1)[0] < PRIOR_ALPHA
    assert len(asked) < 10  # ... then stops asking (k = 0 skips propose) within a few steps


def test_new_request_probes_then_backs_off():
    est = AcceptanceEstimate()
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__
    assert choose_draft_length(est.alphas(4), 0.0, v, 4) > 0  # optimistic prior: try drafting
    for _ in range(10):
        est.observe(3, 0)  # every draft rejected
    assert choose_draft_length(est.alphas(4), 0.0, v, 4) == 0
    for _ in range(200):
        est.observe(0, 0)  # not drafting: the counts fade back to the prior, and it probes again
    assert choose_draft_length(est.alphas(4), 0.0, v, 4) > 0


def test_a_new_request_starts_from_the_drafters_engine_wide_record():
    """Each request's prior is its drafter's engine-wide record (the pool): after a request whose every
    draft was rejected, the next one does not probe again from the optimistic prior. A pool nobody
    drafted with fades back to that prior (once per engine step), so the drafter is tried again."""
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__
    pool = AcceptanceEstimate()
    first = AcceptanceEstimate(pool=pool)
    assert choose_draft_length(first.alphas(4), 0.0, v, 4) > 0  # a fresh engine: optimistic
    for _ in range(10):
        first.observe(3, 0)
    pool.absorb(first)  # the request finished
    assert choose_draft_length(AcceptanceEstimate(pool=pool).alphas(4), 0.0, v, 4) == 0
    good, pool2 = AcceptanceEstimate(), AcceptanceEstimate()
    for _ in range(6):
        good.observe(3, 3)
    pool2.absorb(good)
    assert choose_draft_length(AcceptanceEstimate(pool=pool2).alphas(4), 0.0, v, 4) == 3
    for _ in range(200):
        pool.decay()
    assert choose_draft_length(AcceptanceEstimate(pool=pool).alphas(4), 0.0, v, 4) > 0


def test_the_next_request_does_not_reprobe_a_drafter_that_lost():
    """Engine level: a model drafter whose drafts never come is probed by the first request only."""
    from specdecode import SamplingParams

    llm, asked = never_drafting_llm("draft")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate(list(range(5, 25)), params)
    first, asked[:] = len(asked), []
    llm.generate(list(range(30, 50)), params)
    assert first >= 2 and len(asked) <= 1, (first, len(asked))


def test_a_draftless_drafter_keeps_the_optimistic_prior_across_requests():
    """Whether an n-gram or suffix match is right depends on the request (one repeating an earlier
    answer, or fresh text), so a draftless drafter's record does not carry over: each request tries it."""
    from specdecode import SamplingParams

    llm, asked = never_drafting_llm("ngram-simple")
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate(list(range(5, 25)), params)
    first, asked[:] = len(asked), []
    llm.generate(list(range(30, 50)), params)
    assert llm.engine.acceptance is None and len(asked) == first >= 2


def test_cost_model_scales_unmeasured_shapes_pessimistically():
    c = CostModel()
    c.observe(1, 1, 0.1)
    assert c.verify_cost(1, 1) == 0.1
    assert abs(c.verify_cost(1, 3) - 0.3) < 1e-12  # linear upper bound until measured


def test_cost_model_interpolates_between_measured_sizes():
    c = CostModel()
    c.observe(1, 9, 0.2)
    c.observe(1, 17, 0.4)
    assert abs(c.verify_cost(1, 13) - 0.3) < 1e-12
    assert abs(c.verify_cost(2, 13) - 0.4 * 26 / 17) < 1e-12  # another batch size: scaled, as before


def test_calibration_covers_every_short_draft_and_samples_long_ones():
    from specdecode.engine.draft_plan import calibration_points

    assert calibration_points(4) == [1, 2, 3, 4]
    assert calibration_points(65) == list(range(1, 10)) + [16, 32, 65]


def test_calibration_measures_short_sizes_twice_and_long_ones_once():
    """A fresh engine's calibration delays its first request: the long verify sizes, which cost the
    most, are measured once (the short ones, where most decisions fall, best of two)."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    llm = tiny_llm("ngram", ngram_size_m=16)  # drafts up to 16 tokens: verify sizes up to 17
    eng = llm.engine
    sizes = []
    forward = eng.runner.forward

    def counting(slots, tokens, *a, **k):
        sizes.append(len(tokens[0]))
        return forward(slots, tokens, *a, **k)

    eng.runner.forward = counting
    eng.planner.calibrate(eng.runner, eng.kv, eng.prefix_cache)
    assert sizes == [32] + [t for t in range(1, 10) for _ in range(2)] + [16, 17]
    assert sorted(t for b, t in eng.planner.costs.v) == list(range(1, 10)) + [16, 17]
    out = llm.generate(list(range(5, 25)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert len(out[0].token_ids) == 8


def test_draftless_drafters_have_their_own_caps():
    """--draft-max caps model drafters; an n-gram drafter may draft up to its own cap (a long copy
    pays when verifying many tokens costs little more than one)."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    llm = tiny_llm("ngram", draft_max=2, draft_fixed=True, ngram_size_m=16)
    eng = llm.engine
    eng.add_request(list(range(5, 25)), SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    eng.step()  # prefill
    assert eng._draft_lengths(eng.running) == [16]
    llm = tiny_llm("ngram,draft", draft_seed=0, draft_max=2, ngram_size_m=16, max_num_seqs=1)
    assert llm.engine.kv.max_len >= llm.engine.max_model_len + 17  # room for the longest verify
    assert [m.max_tokens for m in llm.engine.proposer.members] == [16, 2]


def test_engine_calibrates_verify_costs_with_a_single_slot():
    """With one KV slot the calibration must run before the request takes it, or v(t > 1) is never
    measured and the pessimistic default keeps every draft length at 0."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    llm = tiny_llm("ngram", max_num_seqs=1, draft_max=3)
    llm.generate([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert {(1, t) for t in range(1, 5)} <= set(llm.engine.planner.costs.v)


def test_untried_deep_positions_inherit_the_first_positions_record():
    """Low first-position acceptance keeps deep positions untried; they must not keep the optimistic
    prior, or a long draft (a verify of k + 1 tokens) looks worth it when one position does not."""
    est = AcceptanceEstimate()
    for _ in range(6):
        est.observe(3, 0)  # position 1 rejected every time: positions 2-3 never tried
    a = est.alphas(4)
    assert a[0] < 0.3 and all(x <= a[0] + 1e-12 for x in a[1:]), a
    v = {1: 1.0, 2: 1.17, 3: 1.37, 4: 1.56, 5: 2.9}.__getitem__
    # break-even for one free draft is a_1 = v(2) - 1 = 0.17: k = 1 may still pay, deeper never
    # (with 0.8 kept for positions 2-4, E(3)/C(3) = 1.97/1.56 would pick k = 3)
    assert choose_draft_length(a, 0.0, v, 4) <= 1


def test_low_acceptance_stays_near_plain_speed():
    """Simulated requests (free n-gram drafts, the int4 verify curve measured here): with 5-15 %
    first-position acceptance the probing costs at most a few % against plain decoding."""
    import random

    v = {1: 1.0, 2: 1.17, 3: 1.37, 4: 1.56, 5: 2.9, 6: 3.0, 7: 2.9, 8: 3.0, 9: 4.2}.__getitem__
    for a1 in (0.05, 0.15):
        rates = []
        for seed in range(40):
            rnd, est, toks, cost = random.Random(seed), AcceptanceEstimate(), 0, 0.0
            while toks < 128:
                k = choose_draft_length(est.alphas(8), 0.0, v, 8)
                acc = 0
                while acc < k and rnd.random() < (a1 if acc == 0 else 0.5):
                    acc += 1
                est.observe(k, acc)
                toks, cost = toks + acc + 1, cost + v(k + 1)
            rates.append(toks / cost)
        assert sum(rates) / len(rates) > 0.95, (a1, sum(rates) / len(rates))


def test_tree_nodes_beyond_its_depth_count_as_cost_only():
    """A tree of k nodes reaches at most its depth: with depth(k) = min(k, 3), nodes past the third
    add verify rows but no modelled gain, so the controller stops at 3 where a chain goes deeper."""
    alphas = [[0.9] * 6]
    v = {t: 1.0 + 0.05 * (t - 1) for t in range(1, 8)}.__getitem__
    assert choose_batch_draft_length(alphas, 0.01, v, 6) == 6
    assert choose_batch_draft_length(alphas, 0.01, v, 6, depth=lambda k: min(k, 3)) == 3
    # drafting costs are per level: the same tree costs 3 head steps whatever its node count
    assert choose_batch_draft_length(alphas, 0.2, v, 6, depth=lambda k: min(k, 3)) == 3


STEEP = {1: 1.0, 2: 1.17, 3: 1.37, 4: 1.56}.__getitem__  # a verify curve of the loaded int4 target


def simulate_model_drafter(a1_at, seed: int, steps: int, draft_cost: float = 0.15, pool: bool = True):
    """One request drafting with a 3-deep model drafter on fixed costs (STEEP, draft_cost per drafted
    token, in units of v(1)): position 1 is accepted with probability a1_at(step), deeper positions
    with 0.5. pool=False gives the request's record no engine-wide pool (a draftless drafter's).
    Returns (tokens per unit of cost, the steps that drafted)."""
    import random

    rnd = random.Random(seed)
    pool_est = AcceptanceEstimate() if pool else None
    est, toks, cost, drafted = AcceptanceEstimate(pool=pool_est), 0, 0.0, []
    for step in range(steps):
        k = choose_draft_length(est.alphas(3), draft_cost, STEEP, 3)
        acc = 0
        while acc < k and rnd.random() < (a1_at(step) if acc == 0 else 0.5):
            acc += 1
        est.observe(k, acc)
        if pool_est is not None:
            pool_est.decay()
        toks, cost = toks + acc + 1, cost + k * draft_cost + STEEP(k + 1)
        if k:
            drafted.append(step)
    return toks / cost, drafted


def test_a_losing_model_drafter_is_reprobed_less_and_less_often():
    """Every probe rejected: a model drafter's record fades slower after each rejected probe, so
    it is probed about half as often as a record at the normal pace, and still probed."""
    model = sum(len(simulate_model_drafter(lambda s: 0.0, seed, 300)[1]) for seed in range(10))
    normal = sum(len(simulate_model_drafter(lambda s: 0.0, seed, 300, pool=False)[1]) for seed in range(10))
    assert 10 * 300 / 60 <= model <= 0.6 * normal, (model, normal)


def test_a_model_drafter_that_loses_stays_near_plain_speed():
    """A head accepted 5-10 % of the time, each probe costing ~0.6 of a step: the probing costs
    less than 3 % against plain decoding (at the normal fading pace it costs ~4-5 %)."""
    for a1 in (0.05, 0.1):
        rates = [simulate_model_drafter(lambda s: a1, seed, 128)[0] for seed in range(40)]
        assert sum(rates) / len(rates) >= 0.97, (a1, sum(rates) / len(rates))


def test_a_model_drafter_that_starts_to_pay_is_found_again():
    """Text the head cannot predict for 100 steps, then text it predicts well (prose turning into
    code): the backed-off record is probed again within the capped interval, and on average the
    head drafts most steps from then on (an unlucky run of rejected probes may delay it further)."""
    late = []
    for seed in range(20):
        _, drafted = simulate_model_drafter(lambda s: 0.05 if s < 100 else 0.7, seed, 250)
        assert any(100 <= s < 140 for s in drafted), seed
        late.append(sum(150 <= s < 250 for s in drafted))
    assert sum(late) / len(late) >= 85, late


def test_cost_model_replaces_the_calibration_quickly():
    """The calibration's measurement (a busy moment, a short context) is one among the first few,
    not a weight that takes tens of steps to fade: the first real measurements average it out."""
    c = CostModel()
    c.observe(1, 1, 0.033)  # calibration
    for _ in range(3):
        c.observe(1, 1, 0.028)
    assert abs(c.verify_cost(1, 1) - 0.02925) < 1e-9  # the mean of the four (an EMA of 0.2: 0.0306)
    for _ in range(40):
        c.observe(1, 1, 0.020)
    assert abs(c.verify_cost(1, 1) - 0.020) < 1e-4  # later, an EMA that follows the machine


def test_cost_model_nearest_shape_is_the_first_measured_at_the_nearest_row_count():
    """An unmeasured shape scales the measurement nearest in rows (any batch; ties: the first measured),
    found by bisection; the same as scanning every measurement."""
    import random
    from bisect import bisect

    rng = random.Random(0)
    c = CostModel()
    for _ in range(60):
        c.observe(rng.randint(1, 8), rng.randint(1, 70), rng.uniform(0.01, 0.1))
    for batch in range(1, 10):
        sizes = c._sizes.get(batch, [])
        for rows in range(1, 90):
            if (batch, rows) in c.v or 0 < bisect(sizes, rows) < len(sizes):
                continue  # measured, or interpolated within this batch's sizes
            (b, n), s = min(c.v.items(), key=lambda kv: abs(kv[0][1] - rows))
            assert c.rows_cost(batch, rows) == s * rows / n


def test_the_gate_closes_a_batch_size_where_speculation_lost_and_backs_off():
    """A window of GATE_WINDOW steps that spent more than plain decoding would have on the same tokens
    closes speculation at that batch size for GATE_PAUSE steps, doubling per losing window in a row
    (capped); other batch sizes stay open, and a window that paid resets the backoff."""
    from specdecode.speculative.gate import GATE_BACKOFF_MAX, GATE_PAUSE, GATE_WINDOW, SpeculationGate

    def window(gate, batch, tokens, seconds, plain=1.0):
        for _ in range(GATE_WINDOW):
            assert gate.open(batch)
            gate.observe(batch, tokens, seconds, plain, drafted=batch, planning=0.0)  # every step verified drafts

    def closed_for(gate, batch):
        n = 0
        while not gate.open(batch):
            n += 1
        return n

    g = SpeculationGate()
    window(g, 8, tokens=8, seconds=1.02)  # nothing accepted, a little planning on top: lost
    assert closed_for(g, 8) == GATE_PAUSE and g.open(1)
    pauses = []
    for _ in range(GATE_BACKOFF_MAX + 2):
        window(g, 8, tokens=8, seconds=1.02)
        pauses.append(closed_for(g, 8))
    assert pauses == [GATE_PAUSE << min(i, GATE_BACKOFF_MAX) for i in range(1, GATE_BACKOFF_MAX + 3)]
    window(g, 8, tokens=11, seconds=1.2)  # 8 + 3 accepted for 1.2 plain steps: paid
    window(g, 8, tokens=8, seconds=1.02)
    assert closed_for(g, 8) == GATE_PAUSE  # the backoff starts over
    window(g, 1, tokens=3, seconds=1.5)  # one sequence, 2 accepted per step at 1.5x a step's cost
    assert g.open(1)


def test_draft_cost_interpolates_between_measured_batch_sizes():
    """A drafter's unit cost is calibrated for a new batch size outside the measured ones (with one row
    besides, the first time); a size between two measured ones starts on the line between them, so a
    batch draining one request at a time calibrates nothing; observations then refine each size."""
    from specdecode.speculative.controller import DraftCost

    calls = []
    cost = DraftCost(lambda n: calls.append(n) or 1.0 + 0.5 * n)
    assert cost(8) == 5.0 and calls == [8, 1]
    assert [cost(n) for n in (7, 6, 5)] == [4.5, 4.0, 3.5] and calls == [8, 1]
    assert cost(9) == 5.5 and calls == [8, 1, 9]
    cost.observe(6, 2.0)
    assert 2.0 < cost(6) < 4.0 and calls == [8, 1, 9]


def test_a_window_that_drafts_nothing_is_judged_early():
    """Open steps in which the controller drafted nothing spent planning for nothing: GATE_IDLE of them
    at the start of a window end it (closed as a loss); one verified draft among them keeps the window
    open to its full GATE_WINDOW steps."""
    from specdecode.speculative.gate import GATE_IDLE, GATE_PAUSE, GATE_WINDOW, SpeculationGate

    def steps_until_closed(gate, drafted):
        n = 0
        while gate.open(8):
            gate.observe(8, 8, 1.02, 1.0, drafted=drafted(n), planning=0.02)
            n += 1
        return n

    g = SpeculationGate()
    assert steps_until_closed(g, lambda n: 0) == GATE_IDLE < GATE_WINDOW
    for _ in range(GATE_PAUSE - 1):  # the loop's last open() was the first closed step
        assert not g.open(8)
    assert steps_until_closed(g, lambda n: 8 * (n == GATE_IDLE - 1)) == GATE_WINDOW


def test_a_window_that_drafts_nothing_is_judged_on_its_planning():
    """An idle window is plain decoding plus planning: its verify clock against the cost model's plain
    step is noise. Planning over GATE_IDLE_SHARE of the plain steps' cost loses (the backoff doubles
    even where the clock put the steps under "plain"); cheap planning stays open without a pause,
    even where the clock put the steps over it, and leaves the backoff as it was."""
    from specdecode.speculative.gate import GATE_IDLE, GATE_IDLE_SHARE, GATE_PAUSE, SpeculationGate

    def idle_window(gate, clock, planning):
        for _ in range(GATE_IDLE):
            assert gate.open(8)
            gate.observe(8, 8, clock, 1.0, drafted=0, planning=planning)
        n = 0  # the observe above ended the window: its pause
        while not gate.open(8):
            n += 1
        return n

    g = SpeculationGate()
    dear, cheap = 2 * GATE_IDLE_SHARE, GATE_IDLE_SHARE / 4
    assert [idle_window(g, 0.97, dear) for _ in range(3)] == [GATE_PAUSE, 2 * GATE_PAUSE, 4 * GATE_PAUSE]
    assert idle_window(g, 1.05, cheap) == 0
    assert idle_window(g, 0.97, dear) == 4 * GATE_PAUSE  # the cheap window reset nothing

def test_a_closed_gate_decodes_plainly_and_then_speculates_again():
    """The engine asks the gate each step: while it is closed at the batch size the step plans and
    drafts nothing (the proposer is not called) and counts as gated; then drafting resumes. Output
    stays plain greedy."""
    from specdecode import SamplingParams
    from specdecode.speculative.gate import _Window
    from tiny_models import tiny_llm

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompt = [5, 6, 7, 8] * 6
    plain = tiny_llm().generate(prompt, params)[0].token_ids
    llm = tiny_llm("ngram")
    eng = llm.engine
    calls = []
    propose = eng.proposer.propose
    eng.proposer.propose = lambda seqs, ks: calls.append(len(eng.running[0].output_ids)) or propose(seqs, ks)
    eng.planner.gate._w[1] = _Window(pause=10)
    out = llm.generate(prompt, params)[0]
    assert out.token_ids == plain
    assert eng.planner.gated_steps == 10 and calls and min(calls) >= 10  # no proposal during the first ten steps


def test_a_step_carrying_prompt_chunks_drafts_nothing():
    """While a prompt joins decoding requests, its chunks ride in their step's forward: the gate
    cannot judge such a step (its forward is no verify's cost), so it drafts nothing, is not counted
    as gated, and drafting resumes once the prompt is in. Output stays plain greedy."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first, second = [5, 6, 7, 8] * 6, list(range(40, 140))  # the second prompt takes 4 chunks of 32
    plain = [o.token_ids for o in tiny_llm(max_num_seqs=2).generate([first, second], params)]
    llm = tiny_llm("ngram", max_num_seqs=2)
    eng = llm.engine
    a = eng.add_request(first, params)
    for _ in range(6):
        eng.step()
    drafted_by_step, merged_steps = [], 0
    b = eng.add_request(second, params)
    while not (a.finished and b.finished):
        joining = any(eng._prefilling(s) for s in eng.running) or any(s is b for s in eng.waiting)
        before = sum(s.stats.draft_tokens for s in (a, b))
        eng.step()
        drafted_by_step.append((joining, sum(s.stats.draft_tokens for s in (a, b)) - before))
        merged_steps += joining
    assert merged_steps >= 3
    assert all(d == 0 for joining, d in drafted_by_step if joining)
    assert any(d > 0 for joining, d in drafted_by_step if not joining)
    assert eng.planner.gated_steps == 0
    assert [a.output_ids, b.output_ids] == plain


def test_a_drafters_measured_prior_replaces_the_optimistic_one():
    """A drafter that ships its measured acceptance (a trained head's held-out report) gives its
    engine-wide record that prior instead of PRIOR_ALPHA: a new request starts there, and a record that
    no request feeds fades back to it (not to the optimistic 0.8)."""
    from specdecode.speculative.controller import PRIOR_ALPHA

    pool = AcceptanceEstimate(prior=(0.5, 0.4))
    assert pool.alphas(3) == [0.5, 0.4, 0.4]  # the last position's prior repeats
    assert AcceptanceEstimate(pool=pool).alphas(2) == [0.5, 0.4]
    for _ in range(10):
        pool.observe(2, 2)
    assert pool.alphas(1)[0] > 0.8
    for _ in range(400):
        pool.decay()
    assert abs(pool.alphas(1)[0] - 0.5) < 1e-3
    assert AcceptanceEstimate().alphas(1) == [PRIOR_ALPHA]
