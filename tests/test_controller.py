"""The draft-length cost model: drafts when verifying is cheap and acceptance high, stops when not."""
from specdecode.spec.controller import AcceptanceEstimate, CostModel, choose_draft_length


def test_choice_follows_costs_and_acceptance():
    v = {1: 1.0, 2: 1.18, 3: 1.38, 4: 1.7, 5: 2.5}.__getitem__  # int4 verify curve measured here
    assert choose_draft_length([0.9] * 4, 0.0, v, 4) == 3  # free drafts, high acceptance
    assert choose_draft_length([0.1] * 4, 0.0, v, 4) == 0  # unpredictable text
    assert choose_draft_length([0.9] * 4, 0.95, v, 4) == 0  # a draft as slow as the target never pays
    assert choose_draft_length([0.9] * 4, 0.0, v, 4, k_min=4) in (0, 4)


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


def test_cost_model_scales_unmeasured_shapes_pessimistically():
    c = CostModel()
    c.observe(1, 1, 0.1)
    assert c.verify_cost(1, 1) == 0.1
    assert abs(c.verify_cost(1, 3) - 0.3) < 1e-12  # linear upper bound until measured


def test_engine_calibrates_verify_costs_with_a_single_slot():
    """With one KV slot the calibration must run before the request takes it, or v(t > 1) is never
    measured and the pessimistic default keeps every draft length at 0."""
    from specdecode import SamplingParams
    from tiny_models import tiny_llm

    llm = tiny_llm("ngram", max_num_seqs=1, draft_max=3)
    llm.generate([5, 6, 7, 5, 6, 7, 5, 6], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert {(1, t) for t in range(1, 5)} <= set(llm.engine.costs.v)
