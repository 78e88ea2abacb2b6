"""Prometheus metrics for /metrics: per-request counters and latency histograms, updated when a
request ends, and engine state (queue, batch, KV slots, prefix cache) read at scrape time.

Names follow vLLM's under a ``specdecode:`` prefix where vLLM has the same figure (a vLLM dashboard
carries over by swapping the prefix): ``spec_decode_num_drafts`` / ``_num_draft_tokens`` /
``_num_accepted_tokens`` / ``_num_accepted_tokens_per_pos{position}`` (0 = the first draft token), ``spec_decode_gated_steps`` (ours),
``request_success{finished_reason}``, ``prompt_tokens``, ``generation_tokens``,
``time_to_first_token_seconds``, ``request_time_per_output_token_seconds``,
``e2e_request_latency_seconds``, ``request_queue_time_seconds``, ``num_requests_running`` /
``_waiting``, ``prefix_cache_queries`` / ``_hits`` (tokens). Each app has its own registry, so
several servers can live in one process (tests, bench-serve). vLLM's mean acceptance length is
1 + accepted / drafts; τ over all verify steps, drafted or not, is 1 + accepted / verify steps."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine.sequence import Sequence
from .worker import EngineWorker

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST
P = "specdecode:"


class _EngineCollector:
    def __init__(self, worker: EngineWorker):
        self.worker = worker

    def collect(self):
        # Read from another thread without a lock: each figure is one int read, and a scrape that
        # sees a step half-done is still a valid sample.
        eng = self.worker.engine
        if eng is None:  # the server has stopped
            return
        yield GaugeMetricFamily(P + "num_requests_running", "Requests holding a KV slot", value=len(eng.running))
        yield GaugeMetricFamily(P + "num_requests_waiting", "Requests queued for a KV slot", value=len(eng.waiting))
        yield GaugeMetricFamily(P + "kv_slots", "KV-cache slots (max concurrent sequences)", value=eng.kv.num_slots)
        yield GaugeMetricFamily(P + "kv_slots_free", "KV-cache slots not in use", value=eng.kv.free_slots)
        yield CounterMetricFamily(P + "requests_aborted", "Requests aborted before they finished "
                                  "(client disconnected, shutdown)", value=self.worker.aborted)
        yield CounterMetricFamily(P + "engine_steps", "Engine steps run", value=self.worker.steps)
        yield CounterMetricFamily(P + "engine_step_seconds", "Time spent in engine steps",
                                  value=self.worker.step_seconds)
        yield CounterMetricFamily(P + "spec_decode_gated_steps", "Decode steps run plainly because speculation "
                                  "lost to plain decoding at their batch size (the speculation gate)",
                                  value=eng.planner.gated_steps)
        pc = eng.prefix_cache
        yield CounterMetricFamily(P + "prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                  value=pc.prompt_tokens if pc else 0)
        yield CounterMetricFamily(P + "prefix_cache_hits", "Prompt tokens whose prefill the prefix cache saved",
                                  value=pc.hit_tokens if pc else 0)
        store = pc.store if pc else None
        yield CounterMetricFamily(P + "prompt_store_hits", "Prompt tokens of those that the host prompt store "
                                  "supplied (--cache-ram)", value=store.hit_tokens if store else 0)
        yield GaugeMetricFamily(P + "prompt_store_bytes", "Host memory the prompt store holds",
                                value=store.bytes if store else 0)


class ServerMetrics:
    def __init__(self, worker: EngineWorker):
        r = self.registry = CollectorRegistry()
        self.requests = Counter(P + "request_success", "Requests finished, by endpoint and finish reason",
                                ["endpoint", "finished_reason"], registry=r)
        self.errors = Counter(P + "request_errors", "Requests answered with an error, by status", ["status"],
                              registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Tokens generated", registry=r)
        self.queue = Histogram(P + "request_queue_time_seconds", "Arrival to holding a KV slot", buckets=_LATENCY,
                               registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first generated token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram(P + "request_time_per_output_token_seconds",
                              "Mean time per generated token after the first, per request", buckets=_PER_TOKEN,
                              registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Arrival to last token", buckets=_LATENCY,
                             registry=r)
        self.drafts = Counter(P + "spec_decode_num_drafts", "Verify steps that checked a draft", registry=r)
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens verified", registry=r)
        self.accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0 = the first)",
                                        ["position"], registry=r)
        self.verify_steps = Counter(P + "spec_decode_num_verify_steps",
                                    "Target verify forwards, one per step per request, with a draft or not",
                                    registry=r)
        # which drafter paid: the same counts per drafter ("none" = steps without a draft), and its time
        self.drafter_steps = Counter(P + "spec_decode_drafter_steps", "Verify steps, by the drafter that drafted",
                                     ["drafter"], registry=r)
        self.drafter_draft_tokens = Counter(P + "spec_decode_drafter_draft_tokens", "Draft tokens verified, by "
                                            "drafter", ["drafter"], registry=r)
        self.drafter_accepted_tokens = Counter(P + "spec_decode_drafter_accepted_tokens", "Draft tokens accepted, "
                                               "by drafter", ["drafter"], registry=r)
        self.drafter_seconds = Counter(P + "spec_decode_drafter_draft_seconds", "Time spent drafting, by drafter",
                                       ["drafter"], registry=r)
        r.register(_EngineCollector(worker))

    def observe(self, endpoint: str, seq: Sequence, queue_s: float | None = None) -> None:
        """``queue_s``: the request's wait for a KV slot."""
        self.requests.labels(endpoint, seq.finish_reason or "abort").inc()
        self.prompt_tokens.inc(len(seq.prompt_ids))
        n = len(seq.output_ids)
        self.generation_tokens.inc(n)
        if queue_s is not None:
            self.queue.observe(queue_s)
        if seq.t_first_token is not None:
            self.ttft.observe(seq.t_first_token - seq.t_arrival)
            if seq.t_finished is not None:
                self.e2e.observe(seq.t_finished - seq.t_arrival)
                if n > 1:
                    self.tpot.observe((seq.t_finished - seq.t_first_token) / (n - 1))
        st = seq.stats
        self.drafts.inc(st.draft_steps)
        self.draft_tokens.inc(st.draft_tokens)
        self.accepted_tokens.inc(st.accepted_tokens)
        for pos, k in enumerate(st.accepted_per_position):
            self.accepted_per_pos.labels(str(pos)).inc(k)
        self.verify_steps.inc(st.steps)
        for name, d in st.by_drafter.items():
            self.drafter_steps.labels(name).inc(d["steps"])
            self.drafter_draft_tokens.labels(name).inc(d["draft_tokens"])
            self.drafter_accepted_tokens.labels(name).inc(d["accepted_tokens"])
            self.drafter_seconds.labels(name).inc(d["draft_time_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
