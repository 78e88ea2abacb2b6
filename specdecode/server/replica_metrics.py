"""/metrics over several engine replicas: each replica's own exposition, every sample labelled with
the replica that counted it (``replica="<id>"``), so that a dashboard can sum them
(``sum without (replica) (...)``) or compare them; then the ingress's own counters (requests sent
again, streams lost with their replica), unlabelled."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PUSH_PERIOD = 1.0  # seconds between a replica's reports: /metrics is at most about this old
STALE_AFTER = 5 * PUSH_PERIOD  # a replica silent this long is gone (killed, scaled down): its series go too


class MetricsBoard:
    """The latest exposition of each replica. It runs as a small Ray actor that the replicas write
    and the ingress reads, so no replica has to reach another."""

    def __init__(self):
        self._reports: dict[str, tuple[float, str]] = {}

    def report(self, replica: str, text: str) -> None:
        self._reports[replica] = (time.monotonic(), text)

    def reports(self) -> dict[str, str]:
        now = time.monotonic()
        self._reports = {r: (t, text) for r, (t, text) in self._reports.items() if now - t <= STALE_AFTER}
        return {r: text for r, (_, text) in self._reports.items()}


class _Labelled:
    def __init__(self, reports: dict[str, str]):
        self.reports = reports

    def collect(self):
        families: dict[str, Metric] = {}
        for replica, text in sorted(self.reports.items()):
            for fam in text_string_to_metric_families(text):
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                out.samples += [s._replace(labels={**s.labels, "replica": replica}) for s in fam.samples]
        return list(families.values())


class IngressMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.retries = Counter("specdecode:replica_retries", "Requests sent again to another replica because "
                               "theirs went away before answering", registry=r)
        self.lost_streams = Counter("specdecode:replica_lost_streams", "Streams ended with an error because "
                                    "their replica went away after they had started", registry=r)

    def render(self, reports: dict[str, str]) -> bytes:
        labelled = CollectorRegistry()
        labelled.register(_Labelled(reports))
        return generate_latest(labelled) + generate_latest(self.registry)
