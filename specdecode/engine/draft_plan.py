"""Each step's draft lengths ("never slower"): the proposer's per-sequence plan valued against the
target's measured cost curve, one length for the batch's verify forward, and the speculation gate.

The engine asks ``lengths`` before a step and reports the step with ``observe`` after it; ``calibrate``
measures the cost curve once, before the first decision, or takes the one an earlier engine saved
(calibration_cache.py). The rules themselves live in speculative/controller.py (acceptance estimates,
CostModel, the batch's best length) and speculative/gate.py (plain steps where speculation lost at a
batch size); this is their bookkeeping per engine."""
from __future__ import annotations

from ..config import SpecConfig
from ..runtime.timer import Timer
from ..speculative.controller import CostModel, best_rate, choose_batch_draft_length
from ..speculative.gate import SpeculationGate
from ..speculative.proposer import Proposer
from .calibration_cache import CHECK_CONTEXT, CHECK_STEPS, CalibrationCache
from .sequence import Sequence


DENSE = 9  # verify sizes up to this are each calibrated (best of two): the usual drafts


def calibration_points(t_max: int) -> list[int]:
    """Verify sizes measured before the first decision: every size up to DENSE, then 16, 32 and t_max
    (long copies); CostModel interpolates between them. The calibration delays a fresh engine's first
    request (every ``specdecode generate``), and the long sizes cost the most (a forward over 65 tokens
    ~12 of one token's on a CPU), so they are few and measured once; the verify forwards that run them
    refine their estimates."""
    dense = list(range(1, min(t_max, DENSE) + 1))
    return dense + [t for t in (16, 32) if DENSE < t < t_max] + ([t_max] if t_max > DENSE else [])


class DraftPlanner:
    def __init__(self, spec: SpecConfig, proposer: Proposer, timer: Timer, cache: CalibrationCache | None = None):
        self.spec, self.proposer, self.timer = spec, proposer, timer
        self.cache = cache  # where an earlier engine's calibration of this model is kept (None: measure)
        self._saved: dict[int, float] | None = None  # a saved curve taken, until its check is done
        self._checks: dict[int, list[float]] = {}  # verify forwards' seconds by tokens, for that check
        self.costs = CostModel()  # v(batch, rows): calibrated once, then every verify forward's time
        self.gate = SpeculationGate()
        self.gated_steps = 0  # steps the gate made plain (speculation lost at their batch size)
        self.gated: bool | None = None  # the gate's verdict on this step (None: it does not apply)
        self.calibrated = False

    def lengths(self, seqs: list[Sequence], max_model_len: int, merged: bool = False) -> list[int]:
        """Each sequence's draft cap this step: one length for the batch (it shares one verify
        forward, priced as if every sequence drafted that much), capped by each sequence's room
        (max_tokens, context length) and the drafter's own cap (--draft-max for a model drafter, the
        n-gram and suffix caps for draftless ones). ``merged``: prompt chunks ride in this step's
        forward; it then drafts nothing (but with --draft-fixed), because the gate cannot judge such a
        step (``observe``) and "never slower" holds only where it can. Sets ``gated``: whether the
        speculation gate closed this step (None: the gate does not apply, as without a drafter, with
        --draft-fixed or in a merged step)."""
        spec, prop = self.spec, self.proposer
        rooms = [max(0, min(s.params.max_tokens - len(s.output_ids) - 1, max_model_len - s.num_tokens - 1,
                            prop.max_tokens)) for s in seqs]
        if spec.spec_type == "none" or not any(rooms):
            return [0] * len(seqs)
        batch = len(seqs)

        priced: dict[int, float] = {}  # the plan asks for the same few shapes many times

        def verify(t: int) -> float:
            if t not in priced:
                priced[t] = self.costs.verify_cost(batch, t)
            return priced[t]

        def value(alphas, cost, depth, k_max, catch_up=0.0):
            return best_rate(alphas, cost, verify, k_max, depth, catch_up)

        if spec.draft_fixed:
            prop.plan(seqs, rooms, value, fixed=True, verify=verify)
            return rooms
        if merged or not self.gate.open(batch):  # plain this step: nothing is planned (a chain's choices reset)
            prop.plan(seqs, [0] * batch, value, verify=verify)
            self.gated = None if merged else True
            return [0] * batch
        prop.plan(seqs, rooms, value, verify=verify)
        alphas = [prop.estimate(s, prop.depth(r)) for s, r in zip(seqs, rooms)]
        k = choose_batch_draft_length(alphas, prop.draft_cost(batch), verify, max(rooms), spec.draft_min,
                                      depth=prop.depth, catch_up=prop.catch_up_cost(seqs))
        self.gated = False
        return [min(k, r) for r in rooms]

    def observe(self, batch: int, results: list, timing, plan_s: float, merged: bool, context: int = 0) -> None:
        """A step of ``batch`` decoding sequences ran (results: their SeqResults; timing: its StepTiming;
        plan_s: the time ``lengths`` took; context: the longest sequence's tokens before it). A forward
        that carried prompt rows (``merged``) is no verify's cost, nor speculation's against plain decoding."""
        if not merged:
            self.costs.observe(batch, timing.verify_rows, timing.verify_s)
            if batch == 1 and context <= CHECK_CONTEXT:
                self._check_saved(timing.verify_rows, timing.verify_s)
        if self.gated is False and not merged:  # an open step: speculation against plain decoding
            planning = plan_s + timing.propose_s
            self.gate.observe(batch, sum(1 + r.accepted for r in results), planning + timing.verify_s,
                              self.costs.verify_cost(batch, 1), sum(r.drafted for r in results), planning)
        self.gated_steps += bool(self.gated)

    def _check_saved(self, tokens: int, seconds: float) -> None:
        """A one-sequence verify forward over ``tokens`` tokens took ``seconds``: towards the check of a
        saved curve, done once CHECK_STEPS forwards of one size have run (engine/calibration_cache.py)."""
        if self._saved is None or tokens not in self._saved:
            return
        times = self._checks.setdefault(tokens, [])
        times.append(seconds)
        if len(times) == CHECK_STEPS:
            self.cache.check(self._saved, tokens, times)
            self._saved = None

    def calibrate(self, runner, kv, prefix_cache) -> None:
        """Measures the target's forward cost over t = 1..K+1 tokens once, on a scratch slot, so the
        controller has a cost curve before its first decision (later steps refine it online). With a
        cache, a curve an earlier engine saved is taken instead (``observe`` checks it against the
        first verify forwards), and a measured one is saved."""
        if self.calibrated or self.spec.spec_type == "none" or self.spec.draft_fixed:
            return
        self.calibrated = True
        points = calibration_points(min(self.proposer.max_tokens, self.spec.max_draft_tokens) + 1)
        curve = self.cache.load(points) if self.cache is not None else None
        if curve is not None:
            self._saved = curve
        elif not kv.free_slots:
            return
        else:
            with kv.scratch_slot() as slot:
                if prefix_cache is not None:
                    prefix_cache.invalidate(slot)  # overwritten below
                runner.forward([slot], [[0] * 32], logits=False)
                kv.set_length(slot, 32)
                curve = {t: self.timer.best_of(  # row_exact: as spec_step verifies one sequence
                    lambda: runner.forward([slot], [[0] * t], row_exact=True), reps=2 if t <= DENSE else 1)
                    for t in points}
            if self.cache is not None:
                self.cache.save(curve)
        for t in points:
            self.costs.observe(1, t, curve[t])
