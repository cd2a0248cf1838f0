"""The server's Prometheus metrics, in a registry of its own (one per server).

Request counters and histograms are kept here as requests end; the stages'
compute time and bytes per edge come from ``pipeline.stats()`` at each scrape
(:mod:`omni_trio.serve.totals`). docs/serving.md lists every series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from omni_trio.serve.totals import RuntimeTotals

#: Request outcomes: ``ok`` or what the answer's error was.
OUTCOMES = (
    "ok", "bad_request", "not_found", "too_large", "queue_full", "timeout", "failed", "unavailable", "disconnected",
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """Request counters, latency histograms and runtime totals of one server, as ``GET /metrics`` shows them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "omni_trio_requests", "HTTP requests to the model endpoints, by outcome", ["outcome"],
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # every outcome shows, at 0 until it happens
        self.in_flight = Gauge(
            "omni_trio_requests_in_flight", "model requests being answered now", registry=self.registry
        )
        self.duration = Histogram(
            "omni_trio_request_duration_seconds", "from a model request's arrival to the end of its answer",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.first_audio = Histogram(
            "omni_trio_time_to_first_audio_seconds", "from a model request's arrival to its first audio bytes",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

        self.realtime_sessions = Gauge(
            "omni_trio_realtime_sessions_active", "realtime connections open now", registry=self.registry
        )
        self.realtime_turns = Counter(
            "omni_trio_realtime_turns", "realtime user turns committed (by the client or the server's VAD)",
            registry=self.registry,
        )
        self.realtime_barge_ins = Counter(
            "omni_trio_realtime_barge_ins", "realtime answers cut short because the user started speaking",
            registry=self.registry,
        )
        self.realtime_response_latency = Histogram(
            "omni_trio_realtime_speech_end_to_first_audio_seconds",
            "from the end of the user's speech (or the commit) to the answer's first audio",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

        #: The runtime's totals (``observe`` a ``pipeline.stats()`` snapshot before rendering).
        self.runtime = RuntimeTotals()
        self.registry.register(self.runtime)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
