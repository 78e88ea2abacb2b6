"""Draft length per step from measured quantities ("never slower").

For a sequence whose drafted position i is accepted with probability a_i (given i-1 accepted), a
chain of k drafts yields E(k) = 1 + a_1 + a_1 a_2 + ... + a_1..a_k tokens per step and costs
C(k) = k * c + v(k + 1) seconds, where c is the measured cost of drafting one token and v(t) the
measured cost of a target forward over t tokens. We pick k in [0, K] maximising E(k) / C(k); k = 0
is plain decoding, chosen whenever drafting does not pay.

Acceptance is estimated per request and per position from exponentially decayed counts with a
prior: counts fade, so a request that stopped drafting drifts back to the prior and probes again.
For a model drafter (a draft model, EAGLE, MTP) the prior is its engine-wide record (``pool``: the
records of finished requests, fading per engine step): its acceptance follows the kind of text, which
a workload keeps from request to request, so a new request starts from what the drafter recently
achieved instead of re-probing from the optimistic PRIOR_ALPHA; a pool that no finished request fed
for a while fades back to its own prior, so a drafter that stopped paying is tried again. That prior is
PRIOR_ALPHA, or the drafter's measured acceptance where it ships one (a trained head's held-out top-1
agreement per draft step, ``Proposer.prior_acceptance``): a fresh engine then does not try a head
everywhere at the optimistic 0.8, in batches where a verify row is dear and the head accepts ~0.5. A
request's own record joins the pool only when it finishes, so no observation counts twice in one
estimate. Draftless drafters (n-gram kinds, suffix) keep PRIOR_ALPHA: whether their matches are right
depends on the request (one repeating an earlier answer, or fresh text), not on the workload (a pool for
them was measured and cost one sequence's speed: docs/benchmarks.md, round 24). Where a draftless drafter
classes its drafts by their evidence (suffix), a chain keeps a record per class, whose prior is the
class's measured acceptance (``Proposer.evidence_prior``; speculative/chain.py).

Re-probing backs off for a model drafter. A probe of a 3-deep head costs about half a step; with the
counts fading at DECAY, a record that settles at ~10 % acceptance is pulled back over the break-even
point every ~6 steps, and those probes cost more than the drafter returns. So a model drafter's record
fades 2**m times slower on the steps it does not draft after m drafted steps in a row rejected at their
first position (m capped at BACKOFF_MAX): the interval between failed probes doubles, up to 4x, and one
accepted token returns it to the normal pace. The cap bounds how late a drafter that starts to pay
mid-request (prose turning into code) is found again. A draftless drafter's record (no pool) keeps the
normal pace: a single n-gram proposer only looks for a match on the steps its record allows, and
looking costs microseconds."""
from __future__ import annotations

from bisect import bisect, insort
from dataclasses import dataclass, field
from typing import Callable

# Optimistic prior: a request that has never drafted must find drafting worth a try, or it never
# measures its acceptance (with 0.5, a verify of 2 tokens costing > 1.5x one step locks k at 0).
# Measured rejections outweigh the prior within a few steps; decay brings it back for a re-probe.
PRIOR_ALPHA = 0.8  # prior acceptance per position
PRIOR_WEIGHT = 2.0  # pseudo-observations behind the prior
DECAY = 0.97  # per-step decay of the counts (≈ the last 30 steps matter)
BACKOFF_MAX = 2  # a model drafter's idle fading slows at most 2**2-fold after rejected probes
EMA = 0.2  # weight of a new cost measurement
CATCH_UP_STEPS = 8  # steps a drafter's one-off catch-up is spread over when it is priced
CLASS_FADE = 0.9  # an evidence class's engine-wide record fades this much per finished request (chain.py)


def ema(old: float | None, new: float) -> float:
    """A cost measurement folded into its running estimate (the first one is taken as it is)."""
    return new if old is None else (1 - EMA) * old + EMA * new


@dataclass
class AcceptanceEstimate:
    tries: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)
    pool: AcceptanceEstimate | None = None  # the drafter's engine-wide record: this estimate's prior
    misses: int = 0  # drafted steps in a row whose first position was rejected
    prior: tuple[float, ...] = ()  # without a pool: a measured prior per position (the last repeats), else PRIOR_ALPHA

    def alphas(self, k: int) -> list[float]:
        """Estimated acceptance of positions 1..k, each given the earlier ones accepted. Position i's
        prior is position i-1's estimate (position 1's is PRIOR_ALPHA): deep positions are rarely
        tried when acceptance is low, and a fixed optimistic prior there would make long drafts look
        worth a verify of k + 1 tokens that the first position's record already rules out. With a
        pool (or a measured ``prior``), position i's prior is the pool's estimate (the prior's value)
        there, capped (from position 2 on) by this record's estimate of position i-1 for the same reason."""
        base = self.pool.alphas(k) if self.pool is not None else None
        if base is None and self.prior:
            base = [self.prior[min(i, len(self.prior) - 1)] for i in range(k)]
        out, prior = [], PRIOR_ALPHA
        for i in range(k):
            if base is not None:
                prior = base[i] if i == 0 else min(base[i], prior)
            t = self.tries[i] if i < len(self.tries) else 0.0
            h = self.hits[i] if i < len(self.hits) else 0.0
            prior = (h + prior * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def observe(self, asked: int, accepted: int) -> None:
        """One step that asked for ``asked`` draft positions (a position asked for but not drafted
        counts as drafted and rejected) of which the first ``accepted`` were accepted; ``asked`` = 0
        is a step without a draft (``rest``)."""
        if asked <= 0:
            self.rest()
            return
        self.decay()
        self._grow(asked)
        # position i is only "tried" if every earlier position was accepted
        for i in range(min(asked, accepted + 1)):
            self.tries[i] += 1
            self.hits[i] += i < accepted
        self.misses = 0 if accepted else self.misses + 1

    def rest(self) -> None:
        """A step this drafter did not draft: the counts fade, 2**misses times slower (capped) for a
        model drafter's record (see the module docstring)."""
        slow = 0.5 ** min(self.misses, BACKOFF_MAX) if self.pool is not None else 1.0
        self.fade(DECAY ** slow)

    def decay(self) -> None:
        """One step's fading of the counts: they drift back to the prior."""
        self.fade(DECAY)

    def fade(self, factor: float) -> None:
        self.tries = [x * factor for x in self.tries]
        self.hits = [x * factor for x in self.hits]

    def absorb(self, other: AcceptanceEstimate) -> None:
        """A finished request's record joins this (engine-wide) one."""
        self._grow(len(other.tries))
        for i, (t, h) in enumerate(zip(other.tries, other.hits)):
            self.tries[i] += t
            self.hits[i] += h

    def _grow(self, n: int) -> None:
        while len(self.tries) < n:
            self.tries.append(0.0)
            self.hits.append(0.0)


class CostModel:
    """Measured target forward time v(b, n) of a verify forward over n rows (new tokens, all
    sequences together) for batch size b; v(b, t) in the controller's terms is the shape of b rows of
    t tokens each, n = b t (``verify_cost``). A ragged batch that runs packed (the fused CPU layers)
    computes only its real rows, so it is observed at its real row count.

    Each shape's estimate is the running mean of its first measurements, then an EMA (weight
    max(EMA, 1/n) for its n-th): the first one is the calibration's (best of two on a short scratch
    context, perhaps in a busy moment), so the first steps that measure the shape for real outweigh
    it at once instead of over tens of steps."""

    def __init__(self):
        self.v: dict[tuple[int, int], float] = {}
        self._n: dict[tuple[int, int], int] = {}  # measurements of each shape
        self._sizes: dict[int, list[int]] = {}  # batch -> measured row counts, ascending
        self._rows: list[int] = []  # every measured row count (any batch), ascending
        self._first: dict[int, tuple[int, tuple[int, int]]] = {}  # row count -> (order, its first shape)

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        key = (batch, rows)
        if key not in self.v:
            insort(self._sizes.setdefault(batch, []), rows)
            if rows not in self._first:
                insort(self._rows, rows)
                self._first[rows] = (len(self.v), key)
            self.v[key], self._n[key] = seconds, 1
            return
        self._n[key] += 1
        self.v[key] += max(EMA, 1 / self._n[key]) * (seconds - self.v[key])

    def verify_cost(self, batch: int, tokens: int) -> float:
        """A forward of ``batch`` sequences with ``tokens`` new tokens each."""
        return self.rows_cost(batch, batch * tokens)

    def rows_cost(self, batch: int, rows: int) -> float:
        """A forward of ``batch`` sequences with ``rows`` new tokens among them (each at least one)."""
        if (batch, rows) in self.v:
            return self.v[(batch, rows)]
        if not self.v:
            return float(rows)  # no data yet: proportional to work (pessimistic)
        sizes = self._sizes.get(batch, [])
        i = bisect(sizes, rows)
        if 0 < i < len(sizes):  # between two measured sizes of this batch: linear in between
            n0, n1 = sizes[i - 1], sizes[i]
            s0, s1 = self.v[(batch, n0)], self.v[(batch, n1)]
            return s0 + (s1 - s0) * (rows - n0) / (n1 - n0)
        # Unmeasured shape: scale the nearest measurement linearly in rows. Linear is an upper bound
        # on CPU and GPU alike (small verifies cost less than proportionally), so an unmeasured shape
        # never makes drafting look cheaper than it is.
        key = self._nearest(rows)
        return self.v[key] * rows / key[1]

    def _nearest(self, rows: int) -> tuple[int, int]:
        """The measured shape whose row count is nearest to ``rows`` (ties: the first measured), found
        by bisection: the controller asks for many shapes each step."""
        i = bisect(self._rows, rows)
        near = [self._first[n] for n in self._rows[max(0, i - 1):i + 1]]
        return min(near, key=lambda f: (abs(f[1][1] - rows), f[0]))[1]


def best_batch_draft_length(alphas: list[list[float]], draft_cost: float, verify_cost, k_max: int,
                            k_min: int = 0, depth: Callable[[int], int] = lambda k: k,
                            catch_up: float = 0.0) -> tuple[float, int]:
    """(rate, k): the batch's best expected tokens per second and the draft length giving it, for one
    draft length shared by a batch verified in one forward: argmax_k sum_b E_b(depth(k)) / C(k),
    over k in {0} ∪ [max(k_min, 1), k_max]; k = 0 is plain decoding, B / v(1).

    The batch is priced as if every sequence verified k + 1 tokens: exact where rows are padded to
    the longest draft (every sequence pays for it whatever its own draft), an upper bound where a
    ragged batch runs packed (the fused CPU layers), since a drafter that finds fewer tokens then
    leaves its rows out (a length per sequence for packed batches was measured and did not pay:
    docs/benchmarks.md). alphas[b] has sequence b's per-position estimates; a list shorter than
    k (less room left) caps that sequence's draft at its length. depth(k): the positions a draft of
    k tokens reaches and the drafting units it costs (a chain: k; a tree: at most its depth, its
    other nodes are siblings). draft_cost: one batched drafting unit; verify_cost(t): the batch's
    forward over t tokens per row; catch_up: seconds any draft this step costs once, whatever its length
    (a head feeding the entries it missed while idle: ``Proposer.catch_up_cost``), priced as spread over
    CATCH_UP_STEPS steps: it buys the drafter every later step too, but the request may end or its text
    change before that pays back (priced whole, a head idle for long would never be chosen again: its
    bounded window of missed entries costs about two steps to feed). One sequence: E(k)/C(k)."""
    best_k, best = 0, len(alphas) / verify_cost(1)
    catch_up = catch_up_share(catch_up)
    gain = [_gains(a) for a in alphas]  # gain[b][d]: E_b over d positions (d capped at len(a))
    reach = max(map(len, alphas), default=0)  # no sequence gains from a position past its estimates
    for k in range(max(1, k_min), k_max + 1):
        d = depth(k)
        rate = sum(g[min(d, len(g) - 1)] for g in gain) / (d * draft_cost + verify_cost(k + 1) + catch_up)
        if rate > best:
            best_k, best = k, rate
        if d >= reach:  # a longer draft gains nothing more: only a cost curve's noise could favour it
            break
    return best, best_k


def catch_up_share(catch_up: float) -> float:
    """One step's share of a one-off catch-up (seconds): the cost a step's draft is priced with."""
    return catch_up / CATCH_UP_STEPS


def choose_batch_draft_length(alphas: list[list[float]], draft_cost: float, verify_cost, k_max: int,
                              k_min: int = 0, depth: Callable[[int], int] = lambda k: k, catch_up: float = 0.0) -> int:
    """The draft length of best_batch_draft_length."""
    return best_batch_draft_length(alphas, draft_cost, verify_cost, k_max, k_min, depth, catch_up)[1]


def _gains(a: list[float]) -> list[float]:
    """g[d] = E over d drafted positions = 1 + a_1 + a_1 a_2 + ... + a_1..a_d, d <= len(a)."""
    g, run = [1.0], 1.0
    for x in a:
        run *= x
        g.append(g[-1] + run)
    return g


def best_rate(alphas: list[float], draft_cost: float, verify_cost, k_max: int,
              depth: Callable[[int], int] = lambda k: k, catch_up: float = 0.0) -> tuple[float, int]:
    """One sequence's best (expected tokens per second, draft length k) over k in [0, k_max]; k = 0 is
    plain decoding, 1 / v(1). Used to compare drafters for a sequence (speculative/chain.py)."""
    return best_batch_draft_length([alphas], draft_cost, verify_cost, k_max, 0, depth, catch_up)


class DraftCost:
    """A drafter's measured seconds per drafting unit (one draft token, or one tree level) for each
    batch size, EMA-smoothed. A batch size seen for the first time is measured by ``calibrate(n)`` (a
    drafter times one unit for n rows on a scratch slot with ``Timer.best_of``), together with one
    row, so that later sizes between two measured ones start from the straight line between them
    instead of a measurement of their own: a batch that drains one request at a time would otherwise
    stall a step per size for a calibration (the cost of a unit grows smoothly with its rows)."""

    def __init__(self, calibrate: Callable[[int], float]):
        self._calibrate = calibrate
        self._s: dict[int, float] = {}

    def observe(self, batch: int, seconds: float) -> None:
        self._s[batch] = ema(self._s.get(batch), seconds)

    def __call__(self, batch: int) -> float:
        if batch not in self._s:
            lo = max((n for n in self._s if n < batch), default=None)
            hi = min((n for n in self._s if n > batch), default=None)
            if lo is None or hi is None:
                self._s[batch] = self._calibrate(batch)
                if 1 not in self._s:
                    self._s[1] = self._calibrate(1)
            else:
                self._s[batch] = self._s[lo] + (self._s[hi] - self._s[lo]) * (batch - lo) / (hi - lo)
        return self._s[batch]
