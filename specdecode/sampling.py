"""Logits → processed distribution → token (stop strings: engine/stop.py).

``process_logits`` is the single place where sampling settings shape a distribution. The speculative
verifier runs it on both the target's and the draft's logits, so the p and q it compares are
processed identically; acceptance is lossless with respect to exactly this processed p."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .kernels import native_kernels
from .sampling_params import SamplingParams


TOP_HEAD = 256  # tokens of each row's descending order that top-k / top-p look at first
TOP_HEAD_MAX = 2048  # the longest head taken before sorting the whole row


def _native_for(rows: torch.Tensor):
    """The native kernels where they take these rows (float32 [N, V] on the CPU, unit stride along V),
    else None."""
    k = native_kernels()
    if k is not None and rows.device.type == "cpu" and rows.dtype == torch.float32 and rows.dim() == 2 \
            and rows.stride(-1) == 1:
        return k
    return None


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [N, V] -> int64 [N]: each row's argmax, the first index of its maximum (torch.argmax's
    rule, NaN included). The greedy token of every row, computed natively on the CPU where it can be."""
    k = _native_for(logits)
    return logits.argmax(-1) if k is None else k.argmax_rows(logits)


def process_logits(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams]) -> torch.Tensor:
    """logits [N, V] → probs [N, V] float32, each row summing to 1.

    Order (as in vLLM / HF): temperature, top-k, top-p, min-p, renormalise. ``params`` is one setting
    for every row or one per row. Greedy rows are one-hot at argmax (ties: the lowest index).
    Filters are tie-inclusive: a token whose probability equals the cut-off value is kept, so the
    result never depends on sort order. The argmax always survives, so no row becomes empty as long
    as it has one finite logit."""
    logits = logits.float()
    n, v = logits.shape
    rows = [params] * n if isinstance(params, SamplingParams) else list(params)
    if len(rows) != n:
        raise ValueError(f"{len(rows)} SamplingParams for {n} rows of logits")
    temp, top_k, top_p, min_p = _param_columns(rows, logits.device)  # each [N, 1]
    greedy = torch.tensor([p.greedy for p in rows], device=logits.device).reshape(n, 1)
    scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)

    # Decided from the Python values, so that skipping unused filters costs no device sync.
    use_top_k = any(0 < p.top_k < v for p in rows)
    use_top_p = any(p.top_p < 1 for p in rows)
    if use_top_k or use_top_p:
        # Both filters read only the head of each row's descending order: top-k its k-th value, top-p
        # the shortest prefix holding top_p of the mass. topk selects that head without sorting the
        # vocabulary (a sort of ~150k logits costs ~20x a topk of a few hundred); a top-p prefix longer
        # than the head takes a longer head below.
        m = min(v, max([TOP_HEAD] + [p.top_k for p in rows if 0 < p.top_k < v]))
        head, order = scaled.topk(m, dim=-1)  # [N, m], descending
        # top-k: keep everything >= the k-th largest value; rows with k disabled keep all.
        k_on = (top_k > 0) & (top_k < v)
        kth = head.gather(-1, torch.where(k_on, top_k, torch.ones_like(top_k)) - 1)  # [N, 1]
        scaled.masked_fill_(k_on & (scaled < kth), float("-inf"))  # scaled is ours (the division made it)
    probs = torch.softmax(scaled, dim=-1)

    if use_top_p:
        # Softmax is monotone, so ``order`` still sorts probs (masked tokens sit at the end with 0).
        # Gathered rather than recomputed so the cut-off compares bit-identical values. A prefix's sums
        # are the full order's (cumsum runs in order), so the cut-off is the one a full sort gives.
        while True:
            sorted_probs = probs.gather(-1, order)  # [N, m]
            mass_before = torch.nn.functional.pad(sorted_probs.cumsum(-1)[:, :-1], (1, 0))  # exclusive cumsum
            # Smallest prefix reaching top_p: keep a token while the mass before it is < top_p. The first
            # token always has mass_before == 0 < top_p. Cut-off = the smallest kept probability.
            n_keep = (mass_before < top_p).sum(-1, keepdim=True)  # [N, 1] in 1 .. m
            if m == v or not bool(((n_keep == m) & (top_p < 1)).any()):  # else the prefix may go on past m
                break
            m = 8 * m if 8 * m <= TOP_HEAD_MAX and 8 * m < v else v  # past that a whole sort is cheaper
            order = (scaled.topk(m, dim=-1) if m < v else scaled.sort(dim=-1, descending=True)).indices
        cutoff = sorted_probs.gather(-1, n_keep - 1)
        cutoff = torch.where(top_p < 1, cutoff, torch.zeros_like(cutoff))
        probs.masked_fill_(probs < cutoff, 0.0)

    if any(p.min_p > 0 for p in rows):
        # Relative to the most likely token; renormalisation does not change the ratio.
        probs.masked_fill_(probs < min_p * probs.amax(-1, keepdim=True), 0.0)

    probs.div_(probs.sum(-1, keepdim=True))  # sum >= the argmax's probability > 0 (probs: softmax's own)
    if any(p.greedy for p in rows):
        one_hot = torch.zeros_like(probs).scatter_(-1, argmax_rows(logits)[:, None].to(probs.device), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], prompts: Sequence[list[int]],
                    outputs: Sequence[list[int]]) -> torch.Tensor:
    """logits [N, V] → float32 logits with each row's penalties applied, as vLLM applies them (before
    process_logits): the repetition penalty r on every token of the row's prompt or output so far (its
    logit divided by r where positive, multiplied by r where not), then logit -= frequency * count +
    presence * [count > 0] over the output so far. Row i's request settings, prompt and output so far:
    params[i], prompts[i], outputs[i] (for a verify row, the output includes the draft tokens on the
    path to its node). Rows without a penalty are returned as they came.

    Only the tokens a row has seen change, so each row updates those alone (a few hundred entries, not
    [R, V] temporaries: ~1.2 ms a row of a 152k vocabulary). A token it has not seen would get
    logit - f * 0 - p * 0, which is the logit itself unless a penalty is negative (then -0.0 becomes
    +0.0): such rows take the whole-row formula (``_penalize_rows``), so the bits are its own."""
    rows = [i for i, p in enumerate(params) if p.penalized]
    logits = logits.float()
    if not rows:
        return logits
    out = logits.clone()
    dense = [i for i in rows if params[i].frequency_penalty < 0 or params[i].presence_penalty < 0]
    if dense:
        out[dense] = _penalize_rows(logits[dense], [params[i] for i in dense], [prompts[i] for i in dense],
                                    [outputs[i] for i in dense])
    dev = logits.device
    for i in (i for i in rows if i not in dense):
        p = params[i]
        row = out[i]  # a view: updated in place
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompts[i]) | set(outputs[i])), dtype=torch.long, device=dev)
            x, rep = row[seen], torch.tensor(p.repetition_penalty, dtype=torch.float32, device=dev)
            row[seen] = torch.where(x > 0, x / rep, x * rep)
        if outputs[i]:
            ids, counts = torch.unique(torch.tensor(outputs[i], dtype=torch.long, device=dev), return_counts=True)
            f = torch.tensor(p.frequency_penalty, dtype=torch.float32, device=dev)
            pres = torch.tensor(p.presence_penalty, dtype=torch.float32, device=dev)
            row[ids] = row[ids] - f * counts.float() - pres
    return out


def _penalize_rows(x: torch.Tensor, params: Sequence[SamplingParams], prompts: Sequence[list[int]],
                   outputs: Sequence[list[int]]) -> torch.Tensor:
    """apply_penalties' formula over whole rows: x [R, V] float32, every row penalized."""
    v, dev = x.shape[-1], x.device

    def marks(seqs) -> tuple[torch.Tensor, torch.Tensor]:  # (row, token) per occurrence
        r = torch.tensor([j for j, s in enumerate(seqs) for _ in s], dtype=torch.long, device=dev)
        t = torch.tensor([tok for s in seqs for tok in s], dtype=torch.long, device=dev)
        return r, t

    counts = torch.zeros(len(params), v, device=dev)  # [R, V] output occurrences
    r, t = marks(outputs)
    counts.index_put_((r, t), torch.ones_like(t, dtype=counts.dtype), accumulate=True)

    def col(name: str) -> torch.Tensor:  # [R, 1]: one setting of each row
        return torch.tensor([getattr(p, name) for p in params], device=dev).reshape(-1, 1)

    if any(p.repetition_penalty != 1.0 for p in params):
        rep = col("repetition_penalty")
        seen = counts > 0
        seen[marks(prompts)] = True
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    return x - col("frequency_penalty") * counts - col("presence_penalty") * (counts > 0)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, u: torch.Tensor | None = None,
           rows: torch.Tensor | None = None) -> torch.Tensor:
    """probs [N, V] → tokens [N] long; the same generator state gives the same tokens. ``u`` [N]:
    the uniforms to use instead of drawing them from ``generator`` (rows with their own generators).
    ``rows`` (int64 [R]): sample rows ``probs[rows]`` instead (tokens [R]), without gathering them.

    Inverse CDF with one uniform per row: the first index whose cumulative mass exceeds u · total.
    Several times faster on CPU than torch.multinomial / an exponential race, which draw V random
    numbers per row, and it never forces a device sync. The cumulative sum is in float64, so its
    rounding is far below float32 probability resolution; a zero-probability token is never picked
    (its CDF step is exactly flat). u is drawn in float32 (<= 1 - 2^-24), so u · total < total and the
    index stays in range. Rows with a single non-zero entry (greedy) give their argmax. On the CPU the
    native kernel (kernels/sample.c) gives the same tokens without the float64 copies."""
    n = probs.shape[0] if rows is None else len(rows)
    if u is None:
        u = torch.rand(n, 1, generator=generator, device=probs.device)
    k = _native_for(probs)
    if k is not None:
        tokens = k.sample_rows(probs, u.reshape(-1).double().contiguous(),
                               None if rows is None else rows.to(torch.long).contiguous())
        bad = tokens < 0  # rows with NaN, infinities or negative entries: PyTorch's path below decides them
        if bool(bad.any()):
            picked = probs if rows is None else probs[rows]
            tokens[bad] = _sample_rows(picked[bad], u.reshape(-1, 1)[bad])
        return tokens
    return _sample_rows(probs if rows is None else probs[rows], u)


def _sample_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """sample's rule in PyTorch: probs [N, V], u [N] or [N, 1]."""
    cdf = probs.double().cumsum(-1)  # [N, V]
    u = u.reshape(-1, 1).to(probs.device).double()
    drawn = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)
    deterministic = (probs > 0).sum(-1) == 1
    return torch.where(deterministic, argmax_rows(probs.float()), drawn)


def draft_token(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None, p_min: float,
                ids: torch.Tensor | None = None, vocab_size: int = 0) -> tuple[int, torch.Tensor | None, bool]:
    """One token of a model-based draft from its logits [V]: (token, q, confident). Greedy requests
    draft the argmax (q None: a deterministic draft); sampled ones draw from q = process_logits, the
    exact distribution the acceptance rule needs, with the uniform ``u`` [1] (the request's stream).
    confident: the drafted token's probability (greedy) or q's top probability reaches ``p_min``
    (--draft-p-min). ``ids`` (int64 [len(logits)], on logits' device): logits cover a sub-vocabulary,
    entry j being token ids[j] (ascending) of a vocabulary of ``vocab_size`` tokens, the others'
    logits -inf: the same draft as from the whole row, without writing it out for a greedy request
    (q [vocab_size] for a sampled one)."""
    if params.greedy:
        j = int(argmax_rows(logits.reshape(1, -1))[0])  # ascending ids: the first maximum maps to the first
        return (j if ids is None else int(ids[j])), None, float(torch.softmax(logits, -1)[j]) >= p_min
    if ids is not None:
        logits = logits.new_full((vocab_size,), float("-inf")).index_copy_(0, ids, logits)
    q = process_logits(logits.unsqueeze(0), params)[0]
    tok = int(sample(q.unsqueeze(0), u=u)[0])
    return tok, q, float(q.max()) >= p_min


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log probability under the model, and the most likely tokens at its position."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log probability), most likely first


def token_logprobs(logits: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
    """logits [n, V]: the raw logits of the rows that predicted tokens[0..n); each token's log
    probability under log_softmax in float32 (before temperature and filters, as vLLM reports by
    default), with the k most likely tokens of its row. Whatever drafted a token, its row is the one
    plain decoding would have computed, so the figures are those of plain decoding."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [n, V]
    chosen = lp.gather(-1, torch.tensor(tokens, device=lp.device).reshape(-1, 1))[:, 0].tolist()
    if k == 0:
        return [TokenLogprob(t, c) for t, c in zip(tokens, chosen)]
    vals, ids = lp.topk(min(k, lp.shape[-1]), dim=-1)  # [n, k]
    return [TokenLogprob(t, c, tuple(zip(i, v))) for t, c, i, v in zip(tokens, chosen, ids.tolist(), vals.tolist())]


# Purposes of a request's random numbers at one position: the target's token there, a draft model's
# token there, and (COIN + node) the acceptance coin of a sampled draft node.
TARGET, DRAFT, COIN = 0, 1, 2
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic): a bijection that scrambles bits."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class RandomStream:
    """A request's random numbers, counter-based: the uniform for (position, purpose) is a hash of
    (seed, position, purpose), so what a position draws never depends on how many drafts, rejections
    or batch-mates came before. Plain decoding samples the token at position i with
    ``u(i, TARGET)``; speculative verification of deterministic drafts samples the target's token at
    every position it reaches with the same number, so a seed gives the same text either way."""

    def __init__(self, seed: int):
        self.seed = seed
        self._key = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))

    def u(self, positions, purpose=TARGET) -> torch.Tensor:
        """float32 uniforms in [0, 1) (24 random bits, as torch.rand), one per position (and purpose,
        broadcast with positions)."""
        pos = np.asarray(positions, dtype=np.uint64)
        h = _mix(_mix(self._key ^ pos) ^ np.asarray(purpose, dtype=np.uint64))
        return torch.from_numpy(((h >> np.uint64(40)).astype(np.float64) * 2.0 ** -24).astype(np.float32))


def _param_columns(rows: list[SamplingParams], device) -> tuple[torch.Tensor, ...]:
    """temperature, top_k, top_p, min_p as [N, 1] columns (float, long, float, float)."""
    def col(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device).reshape(len(rows), 1)
    return (col([p.temperature for p in rows], torch.float32), col([max(p.top_k, 0) for p in rows], torch.long),
            col([p.top_p for p in rows], torch.float32), col([p.min_p for p in rows], torch.float32))
