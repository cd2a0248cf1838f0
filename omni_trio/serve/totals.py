"""Prometheus counters of the runtime's own totals, fed by ``pipeline.stats()`` snapshots.

Stages keep running totals (compute-seconds, tensor bytes sent per edge); a
scrape reads them with ``stats()``. A total restarts from zero when its worker
process is restarted, and reads zero while the process is down, so the values
are not exported as read: :class:`RuntimeTotals` keeps, per source (a stage or
replica address, and for bytes its receiver and transport), the last value
seen, adds only what each snapshot gained, and treats a value below the last
one as a restart (it then adds the new value whole). The exported counters
therefore never go backwards. A restart that a scrape never sees, whose new
total already passed the old one, is counted short by the old total.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omni_trio.comm.router import COORDINATOR
from omni_trio.config.replicas import logical_name
from omni_trio.coordinator.stats import PipelineStats

BUSY_NAME = "omni_trio_stage_busy_seconds"
EDGE_NAME = "omni_trio_edge_bytes"
BACKLOG_NAME = "omni_trio_stream_backlog_bytes"
REFUSED_STREAMS_NAME = "omni_trio_streams_refused"
REFUSED_CONNECTIONS_NAME = "omni_trio_refused_connections"


class _Gains:
    """Monotonic totals per label set, from per-source readings that may restart from zero."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], float] = {}
        self.totals: dict[tuple[str, ...], float] = {}

    def read(self, source: tuple[str, ...], labels: tuple[str, ...], value: float) -> None:
        last = self._last.get(source)
        gained = value if last is None or value < last else value - last
        self._last[source] = value
        self.totals[labels] = self.totals.get(labels, 0.0) + gained


class RuntimeTotals(Collector):
    """``omni_trio_stage_busy_seconds_total{stage}``, ``omni_trio_edge_bytes_total{from_stage,to_stage,transport}``,
    ``omni_trio_refused_connections_total{process}``, the gauge ``omni_trio_stream_backlog_bytes`` (the last
    snapshot's unread stream bytes) and ``omni_trio_streams_refused_total`` (streams refused by
    ``stream_admission``; the coordinator's own count, which no worker restart resets).

    Call :meth:`observe` with each new snapshot, one at a time, in the order
    they were taken; ``collect`` (the registry's scrape) reports the totals.
    """

    def __init__(self) -> None:
        self._busy = _Gains()
        self._edges = _Gains()
        self._refused_connections = _Gains()
        self._backlog = 0
        self._refused_streams = 0

    def observe(self, stats: PipelineStats) -> None:
        """Add what ``stats`` gained since the previous snapshot."""
        self._backlog = stats.stream_backlog_bytes
        self._refused_streams = stats.refused_streams
        for process, count in stats.refused_connections.items():
            self._refused_connections.read((process,), (process,), count)
        senders = [(COORDINATOR, stats.sent_bytes)]
        for address, stage in stats.stages.items():
            self._busy.read((address,), (logical_name(address),), stage.busy_seconds)
            senders.append((address, stage.sent_bytes))
        for address, sent in senders:
            for receiver, by_transport in sent.items():
                for transport, nbytes in by_transport.items():
                    labels = (logical_name(address), logical_name(receiver), transport)
                    self._edges.read((address, receiver, transport), labels, nbytes)

    def collect(self) -> Iterator[Metric]:
        """The counter families, one sample per stage, per used edge and transport and per process, and the
        gauge."""
        busy = CounterMetricFamily(
            BUSY_NAME, "compute-seconds each stage spent in user compute, summed over its threads and replicas",
            labels=["stage"],
        )
        for (stage,), seconds in sorted(self._busy.totals.items()):
            busy.add_metric([stage], seconds)
        edges = CounterMetricFamily(
            EDGE_NAME, "tensor bytes sent on each edge, by transport ('coordinator' is the caller's side)",
            labels=["from_stage", "to_stage", "transport"],
        )
        for labels, nbytes in sorted(self._edges.totals.items()):
            edges.add_metric(list(labels), nbytes)
        refused = CounterMetricFamily(
            REFUSED_CONNECTIONS_NAME,
            "connections a process's inbox closed for the endpoints limits (unproven, unfinished, no descriptor)",
            labels=["process"],
        )
        for (process,), count in sorted(self._refused_connections.totals.items()):
            refused.add_metric([process], count)
        yield busy
        yield edges
        yield refused
        yield GaugeMetricFamily(
            BACKLOG_NAME,
            "bytes of stream events queued for streaming callers and not read yet (capped by "
            "stream_delivery.max_total_backlog_bytes)",
            value=self._backlog,
        )
        yield CounterMetricFamily(
            REFUSED_STREAMS_NAME,
            "streaming requests refused because the live streams could not take one more (stream_admission)",
            value=self._refused_streams,
        )
