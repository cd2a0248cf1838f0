"""The server's Prometheus metrics, in a registry of its own (one per server).

Request counters and histograms are kept here as requests end; the stages'
compute time and bytes per edge come from ``pipeline.stats()`` at each scrape
(:mod:`omni_trio.serve.totals`). docs/serving.md lists every series.

The audio series measure what a client hears, from the audio the server sends
(:class:`Playback`): time to first audio (TTFP), real-time factor, and gaps.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from omni_trio.serve.totals import RuntimeTotals

#: Request outcomes: ``ok`` or what the answer's error was.
OUTCOMES = (
    "ok", "bad_request", "not_found", "too_large", "queue_full", "timeout", "failed", "unavailable", "disconnected",
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Real-time factors: the answer's time over its audio's length (below 1: made faster than it plays).
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)


class Playback:
    """One answer's audio as a client plays it, from the times its chunks are sent.

    Playback starts when the first audio is sent. A chunk is due when the audio sent before it has
    played: ``start + seconds already sent``. A chunk sent after that is a gap, and its lateness is
    underrun: the player waited that long, so playback resumes later (``start`` moves by it).
    """

    def __init__(self) -> None:
        self.start: float | None = None
        self.sent_s = 0.0
        self.gaps = 0
        self.underrun_s = 0.0

    def sent(self, now: float, seconds: float) -> float:
        """A chunk playing for ``seconds`` was sent at ``now``; returns how late it was (0 if on time)."""
        late = 0.0
        if self.start is None:
            self.start = now
        else:
            late = max(0.0, now - (self.start + self.sent_s))
            if late > 0:
                self.gaps += 1
                self.underrun_s += late
                self.start += late
        self.sent_s += seconds
        return late


class Metrics:
    """Request counters, latency histograms, audio series (labelled by ``model``) and runtime totals of one
    server, as ``GET /metrics`` shows them."""

    def __init__(self, model: str) -> None:
        self.model = model
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
        self.audio_ttfp = Histogram(
            "omni_trio_audio_ttfp_seconds", "from a request's arrival to its first audio byte sent",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        ).labels(model)
        self.audio_rtf = Histogram(
            "omni_trio_audio_rtf", "real-time factor: from a request's arrival to its last audio sent, over "
            "the seconds of audio sent", ["model"], buckets=_RTF_BUCKETS, registry=self.registry,
        ).labels(model)
        self.audio_underrun = Counter(
            "omni_trio_audio_underrun_seconds", "seconds a client's playback waited for audio sent late",
            ["model"], registry=self.registry,
        ).labels(model)
        self.audio_gaps = Counter(
            "omni_trio_audio_stream_gaps", "audio chunks sent after the audio before them had played",
            ["model"], registry=self.registry,
        ).labels(model)
        self.audio_streams = Gauge(
            "omni_trio_audio_streams_active", "answers whose audio is being sent now", ["model"],
            registry=self.registry,
        ).labels(model)

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
