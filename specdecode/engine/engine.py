"""The engine: a target model, its KV cache, a proposer and the draft-length controller.

Requests wait in a queue, are admitted when a KV slot is free, prefilled in chunks, then advanced
together one speculative step at a time (continuous batching: sequences join and leave between
steps). Single-stream generation is the same loop with one request. Never imports server or CLI."""
from __future__ import annotations

import logging
import secrets
from collections import deque

import torch

from ..config import EngineConfig
from ..errors import InvalidRequestError, OutOfMemoryBudgetError
from ..layers.quant import format_names
from ..kernels import native_kernels
from ..loader import load_checkpoint, weight_quant
from ..runtime import attention
from ..runtime.cpus import threads_to_set
from ..runtime.device import kv_dtype, resolve_device_dtype
from ..runtime.kv_cache import KVCache
from ..runtime.model_runner import ModelRunner
from ..runtime.target import Target
from ..runtime.timer import Timer
from ..sampling import RandomStream
from ..sampling_params import SamplingParams
from ..speculative import make_proposer
from ..speculative.controller import AcceptanceEstimate
from ..store import resolve_model
from ..tokenizer.detok import StreamingDetokenizer
from .calibration_cache import engine_cache
from .draft_plan import DraftPlanner
from .failures import StepOutput, fail, isolate, snapshot
from .prefix_cache import PrefixCache
from .prompt_store import PromptStore
from .sequence import Sequence
from .spec_step import speculative_step

log = logging.getLogger("specdecode")


def release_threads() -> None:
    """Frees the calling thread's OpenMP pool (kernels/threads.c). Loading runs parallel work on the
    constructing thread, and the thread that steps the engine may be another (the server's worker):
    while both pools live, libgomp manages more threads than there are CPUs and stops spin-waiting
    between the ~150 parallel regions of a step, which made the server's steps ~25 % slower.
    Stepping on this thread simply builds a new pool."""
    nk = native_kernels()
    if nk is not None:
        nk.release_threads()


class Engine:
    def __init__(self, cfg: EngineConfig, model=None, tokenizer=None, draft=None):
        """Loads ``cfg.model`` unless a (model, tokenizer) pair is given (tests build small ones);
        ``draft``: a ready drafter for the proposer (a (model, tokenizer) for --spec-type draft, a
        head for eagle / draft-mtp), else the proposer loads its own."""
        self.cfg = cfg
        threads = threads_to_set(cfg.threads, torch.get_num_threads())
        if threads:
            torch.set_num_threads(threads)
        self.device, self.dtype = resolve_device_dtype(cfg.device, cfg.dtype)
        try:
            backend = attention.backend(attention.resolve(cfg.attention_backend, self.device))
        except ValueError as e:
            raise InvalidRequestError(str(e)) from None
        for flag, quant in (("--quant", cfg.quant), ("--quant-draft", cfg.spec.quant_draft)):
            if quant not in ("auto",) + format_names():
                raise InvalidRequestError(f"unknown {flag} {quant!r} (choose from auto, {', '.join(format_names())})")
        path = None  # the model file, where the engine loads it (tests hand in small models)
        if model is None:
            path = resolve_model(cfg.model)
            model, tokenizer = load_checkpoint(path, self.dtype, self.device, weight_quant(cfg.quant, self.device),
                                               cfg.weight_cache)
        self.model, self.tokenizer = model, tokenizer
        mc = model.cfg
        self.max_model_len = min(cfg.max_model_len, mc.max_position_embeddings)
        if mc.sliding_window is not None and self.max_model_len > mc.sliding_window:
            # Every attention path attends the whole prefix; past its window such a model would
            # silently attend too far, so the context is capped at the window instead.
            log.warning("the model attends a sliding window of %d tokens, which specdecode does not "
                        "implement: the context is capped at %d tokens", mc.sliding_window, mc.sliding_window)
            self.max_model_len = mc.sliding_window
        margin = cfg.spec.max_draft_tokens + 1  # verify writes past the committed length
        slot_len = self.max_model_len + margin
        if cfg.kv_cache_tokens is not None:
            slot_len = min(slot_len, cfg.kv_cache_tokens // cfg.max_num_seqs)
            if slot_len < 16 + margin:
                raise OutOfMemoryBudgetError(f"--kv-cache-tokens {cfg.kv_cache_tokens} is too small for "
                                             f"{cfg.max_num_seqs} sequence(s)")
            self.max_model_len = slot_len - margin
        self.kv = KVCache(mc.num_layers, cfg.max_num_seqs, slot_len, mc.num_kv_heads, mc.head_dim,
                          kv_dtype(cfg.kv_cache_dtype, model.quant, self.device, self.dtype), self.device)
        self.runner = ModelRunner(model, self.kv, backend)
        if cfg.prompt_cache_mib < 0:
            raise InvalidRequestError(f"--cache-ram must be >= 0 MiB (0 turns the prompt store off), "
                                      f"not {cfg.prompt_cache_mib}")
        store = PromptStore(cfg.prompt_cache_mib * 2**20) if cfg.prompt_cache_mib else None
        self.prefix_cache = PrefixCache(self.kv, store) if cfg.enable_prefix_caching else None
        self.timer = Timer(self.device)
        self.target = Target(model, tokenizer, self.kv, self.device, self.dtype, self.timer, cfg.model,
                             cfg.kv_cache_dtype, backend, cfg.weight_cache)
        self.proposer = make_proposer(cfg.spec, self.target, draft)
        costs = engine_cache(path, model.quant, self.dtype, self.kv.k.dtype, self.device, backend.name) \
            if path is not None and cfg.spec.calibration_cache else None
        self.planner = DraftPlanner(cfg.spec, self.proposer, self.timer, costs)
        # a model drafter's engine-wide record, each request's prior (controller.py; None: draftless)
        self.acceptance = None if self.proposer.draftless else AcceptanceEstimate(prior=self.proposer.prior_acceptance)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        release_threads()

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequestError(f"the prompt has {len(prompt_ids)} tokens but the context holds "
                                      f"{self.max_model_len}")
        stream = None
        if not params.greedy:
            stream = RandomStream(params.seed if params.seed is not None else secrets.randbits(63))
        seq = Sequence(list(prompt_ids), params, StreamingDetokenizer(self.tokenizer),
                       frozenset(self.tokenizer.eos_ids), random=stream, max_len=self.max_model_len,
                       acceptance=AcceptanceEstimate(pool=self.acceptance))
        seq.stats.type = self.cfg.spec.spec_type
        self.waiting.append(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        seq.abort()
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._retire()

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prompt (free slots' records and the host store), as vLLM's method of
        this name: later requests prefill from scratch. Running requests are untouched. False when
        the engine caches no prefixes."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.clear()
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- stepping --------------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """Admits waiting requests, advances prefills by one chunk, and runs one speculative step
        for every fully prefilled sequence. Returns the visible text each advanced sequence gained."""
        self.planner.calibrate(self.runner, self.kv, self.prefix_cache)  # before admission: it needs a free slot
        while self.waiting and self.kv.free_slots:
            seq = self.waiting.popleft()
            if self.prefix_cache is not None:
                seq.slot, seq.num_prefilled, seq.num_cached, stash = self.prefix_cache.allocate(seq.prompt_ids,
                                                                                                self.proposer)
                if stash is not None:  # a store hit: the drafter's state for those tokens came with them
                    self.proposer.unstash(seq, stash)
                if seq.num_prefilled:  # a drafter may need hidden states of cached positions: prefill them again
                    seq.num_prefilled = self.proposer.prefill_start(seq, seq.num_prefilled)
                    self.kv.set_length(seq.slot, seq.num_prefilled)
            else:
                seq.slot = self.kv.allocate()
            self.running.append(seq)
        for seq in filter(self._prefilling, self.running):
            self._share_prefix(seq)
        outputs = []
        ready = [s for s in self.running if self._decoding(s)]
        joining = sum(map(self._prefilling, self.running))
        # while at least as many requests decode as prompts wait, --max-prefill-tokens caps the step's
        # prompt tokens, which then ride in the decoders' verify forward (a burst of new prompts, which
        # outnumber the decoders, prefills at once: throttled, it would keep many requests waiting to spare
        # a few a stall); otherwise each chunk is a forward of its own, and a prompt it completes decodes
        # in this step already
        merge = len(ready) >= joining > 0 and self.cfg.max_prefill_tokens > 0
        chunks = self._prefill_plan(self.cfg.max_prefill_tokens if merge else None)
        if not merge:
            for seq, end in chunks:
                self._prefill_alone(seq, end, outputs)
            ready, chunks = [s for s in self.running if self._decoding(s)], []
        if ready:
            before = snapshot(ready, self.kv)
            try:
                t0 = self.timer.now()
                self.planner.gated = None
                ks = self._draft_lengths(ready, bool(chunks))
                t1 = self.timer.now()
                results, timing = speculative_step(self.runner, self.proposer, ready, ks, self.timer.now,
                                                   [(s, s.prompt_ids[s.num_prefilled:end]) for s, end in chunks])
            except Exception as e:
                outputs += isolate(self.runner, self.proposer, ready, before, e, self.timer.now)
                for seq, end in chunks:  # each prompt alone: one whose data made the step raise fails alone
                    self._prefill_alone(seq, end, outputs)
            else:
                for (seq, end), states in zip(chunks, timing.prefilled):
                    self._prefilled(seq, end, states)
                self.planner.observe(len(ready), results, timing, t1 - t0, bool(chunks), max(b[1] for b in before))
                for seq, k, r in zip(ready, ks, results):
                    self.proposer.observe(seq, k, r.drafted, r.accepted)
                    outputs.append(StepOutput(seq, r.delta))
                if self.acceptance is not None:
                    self.acceptance.decay()
        self._retire()
        return outputs

    @staticmethod
    def _decoding(seq: Sequence) -> bool:
        """Prefilled (all but the last prompt token, the first root) and not finished: it takes a step."""
        return seq.num_prefilled >= len(seq.prompt_ids) - 1 and not seq.finished

    @staticmethod
    def _prefilling(seq: Sequence) -> bool:
        """Prompt tokens left to prefill and not finished: it takes a chunk."""
        return seq.num_prefilled < len(seq.prompt_ids) - 1 and not seq.finished

    def _prefill_plan(self, budget: int | None) -> list[tuple[Sequence, int]]:
        """This step's prompt chunks, (sequence, end): up to cfg.prefill_chunk tokens of each prompt, never
        its last one (the first root), at most ``budget`` in all (None: no cap), oldest prompt first."""
        chunks = []
        for seq in filter(self._prefilling, self.running):
            n = self.cfg.prefill_chunk if budget is None else min(self.cfg.prefill_chunk, budget)
            if n <= 0:
                break
            start = seq.num_prefilled
            chunks.append((seq, min(len(seq.prompt_ids) - 1, start + n)))
            if budget is not None:
                budget -= chunks[-1][1] - start
        return chunks

    def _share_prefix(self, seq: Sequence) -> bool:
        """A prompt admitted cold and not begun copies the longest prefix a running request has
        committed (PrefixCache.share: concurrent requests with one system prompt). True when it did."""
        if self.prefix_cache is None or seq.num_prefilled or seq.num_cached:
            return False
        n = self.prefix_cache.share(seq, self.running, self.proposer)
        if n <= 0:
            return False
        seq.num_prefilled = n
        if n == len(seq.prompt_ids) - 1:
            seq.t_prefill_done = self.timer.now()
        return True

    def _prefill_alone(self, seq: Sequence, end: int, outputs: list) -> None:
        """Runs one prompt chunk in a forward of its own; a failure ends that request alone. A prompt
        not begun first looks again for a prefix to share: an earlier chunk of this step may hold it."""
        if self._share_prefix(seq):
            end = min(len(seq.prompt_ids) - 1, seq.num_prefilled + self.cfg.prefill_chunk)
            if end <= seq.num_prefilled:
                return
        try:
            start = seq.num_prefilled
            _, hidden, captured = self.runner.forward([seq.slot], [seq.prompt_ids[start:end]], logits=False,
                                                      capture_layers=self.proposer.capture_layers)
            self._prefilled(seq, end, (hidden[0], {i: h[0] for i, h in captured.items()}))
        except Exception as e:  # this prompt's forward failed: the others go on
            outputs.append(fail(seq, e))

    def _prefilled(self, seq: Sequence, end: int, states) -> None:
        """A chunk's KV is in the cache up to ``end``: commits it and hands its states to the proposer."""
        start = seq.num_prefilled
        self.kv.set_length(seq.slot, end)
        seq.num_prefilled = end
        self.proposer.prefill(seq, start, end, states)
        if end == len(seq.prompt_ids) - 1:
            seq.t_prefill_done = self.timer.now()

    def _draft_lengths(self, seqs: list[Sequence], merged: bool = False) -> list[int]:
        """Each sequence's draft cap this step (DraftPlanner.lengths; ``merged``: prompt chunks ride in
        its forward); tests script it here."""
        return self.planner.lengths(seqs, self.max_model_len, merged)

    def _retire(self) -> None:
        for seq in [s for s in self.running if s.finished]:
            self.running.remove(seq)
            if self.acceptance is not None:
                self.acceptance.absorb(seq.acceptance)
            self.proposer.release(seq)
            if self.prefix_cache is not None:
                if seq.finish_reason == "error":  # its KV may be half-written: never reuse it
                    self.prefix_cache.invalidate(seq.slot)
                else:
                    self.prefix_cache.release(seq.slot, seq.tokens)
            self.kv.free(seq.slot)
            seq.slot = -1
