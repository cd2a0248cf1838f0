"""Views of a trace: summaries and a Chrome/Perfetto timeline.

Pure functions over the event list that :func:`omni_trio.read_trace` returns
(dicts with ``event``, ``ts_ns``, ``process`` and the event's fields, in
time order). ``omni-trio trace summary`` and ``omni-trio trace export``
print and write what these compute; see docs/cli.md and docs/tracing.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

#: Events that end a request, and the status each one gives it.
REQUEST_END = {"request_completed": "completed", "request_failed": "failed", "request_aborted": "aborted"}

#: The thread name given to events of the coordinator (the caller's side) in a timeline.
COORDINATOR = "coordinator"


@attrs.frozen
class EdgeTransport:
    """The transport an edge chose last, from ``comm_transport_selected`` events."""

    process: str
    stage: str
    direction: str
    peer: str
    transport: str
    history: tuple[str, ...]

    @property
    def changes(self) -> int:
        """How many times the edge switched transport after its first choice."""
        return len(self.history) - 1


@attrs.frozen
class StageBusy:
    """Time requests spent in one stage: ``stage_dispatch`` to ``stage_complete``, summed."""

    stage: str
    count: int
    total_ms: float

    @property
    def mean_ms(self) -> float:
        """The mean time per request, in milliseconds."""
        return self.total_ms / self.count if self.count else 0.0


@attrs.frozen
class RequestSummary:
    """How requests ended and how long they took (``request_submitted`` to their end event)."""

    completed: int
    failed: int
    aborted: int
    unfinished: int
    latencies_ms: tuple[float, ...]

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) of the latencies, or None with no finished request."""
        return percentile(self.latencies_ms, q)


@attrs.frozen
class TraceSummary:
    """Everything ``omni-trio trace summary`` prints."""

    events: int
    processes: tuple[str, ...]
    span_ms: float
    transports: tuple[EdgeTransport, ...]
    stages: tuple[StageBusy, ...]
    requests: RequestSummary


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, interpolated linearly; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * min(max(q, 0.0), 100.0) / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def transport_table(events: Iterable[dict[str, Any]]) -> list[EdgeTransport]:
    """Per edge (sending stage, direction, peer), the transport it chose last, in order of first choice."""
    edges: dict[tuple[str, str, str, str], list[str]] = {}
    for event in events:
        if event.get("event") != "comm_transport_selected":
            continue
        key = (
            str(event.get("process", "")),
            str(event.get("stage", "")),
            str(event.get("direction", "")),
            str(event.get("peer_stage", "")),
        )
        edges.setdefault(key, []).append(str(event.get("transport", "")))
    return [
        EdgeTransport(process, stage, direction, peer, history[-1], tuple(history))
        for (process, stage, direction, peer), history in edges.items()
    ]


def stage_key(event: dict[str, Any]) -> str:
    """The stage an event is about: ``voc``, or ``voc@r1`` for an event of replica 1's process."""
    stage = str(event.get("stage", ""))
    replica = event.get("replica")
    return stage if replica is None else f"{stage}@r{replica}"


def stage_busy(events: Iterable[dict[str, Any]]) -> list[StageBusy]:
    """Per stage (per replica of a replicated one), the requests it completed and their summed
    dispatch-to-complete time, in order of first use."""
    started: dict[tuple[Any, str], int] = {}
    totals: dict[str, list[float]] = {}
    for event in events:
        name = event.get("event")
        if name not in ("stage_dispatch", "stage_complete", "stage_failed"):
            continue
        stage = stage_key(event)
        key = (event.get("request_id"), stage)
        if name == "stage_dispatch":
            started[key] = int(event["ts_ns"])
            totals.setdefault(stage, [0, 0.0])
            continue
        begin = started.pop(key, None)
        if begin is None or name == "stage_failed":
            continue
        entry = totals.setdefault(stage, [0, 0.0])
        entry[0] += 1
        entry[1] += (int(event["ts_ns"]) - begin) / 1e6
    return [StageBusy(stage, int(count), total) for stage, (count, total) in totals.items()]


def request_summary(events: Iterable[dict[str, Any]]) -> RequestSummary:
    """Counts of completed, failed, aborted and unfinished requests, and each finished one's latency."""
    submitted: dict[Any, int] = {}
    counts = dict.fromkeys(REQUEST_END.values(), 0)
    latencies: list[float] = []
    for event in events:
        name = event.get("event")
        request_id = event.get("request_id")
        if name == "request_submitted":
            submitted[request_id] = int(event["ts_ns"])
        elif name in REQUEST_END:
            begin = submitted.pop(request_id, None)
            if begin is None:
                continue  # an end without its start (a truncated or appended-to trace)
            counts[REQUEST_END[name]] += 1
            latencies.append((int(event["ts_ns"]) - begin) / 1e6)
    return RequestSummary(
        completed=counts["completed"],
        failed=counts["failed"],
        aborted=counts["aborted"],
        unfinished=len(submitted),
        latencies_ms=tuple(latencies),
    )


def summarize(events: Sequence[dict[str, Any]]) -> TraceSummary:
    """The transport table, per-stage busy time and request latencies of a trace."""
    stamps = [int(event["ts_ns"]) for event in events if "ts_ns" in event]
    processes = tuple(dict.fromkeys(str(event.get("process", "")) for event in events))
    return TraceSummary(
        events=len(events),
        processes=processes,
        span_ms=(max(stamps) - min(stamps)) / 1e6 if stamps else 0.0,
        transports=tuple(transport_table(events)),
        stages=tuple(stage_busy(events)),
        requests=request_summary(events),
    )


# --------------------------------------------------------------------------- Chrome / Perfetto timeline


class _Tracks:
    """Integer pids per process and tids per (process, thread name), with their metadata events."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple[str, str], int] = {}
        self.metadata: list[dict[str, Any]] = []

    def pid(self, process: str) -> int:
        if process not in self.pids:
            pid = self.pids[process] = len(self.pids) + 1
            self.metadata.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                  "args": {"name": process}})
            self.metadata.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                  "args": {"sort_index": pid}})
        return self.pids[process]

    def tid(self, process: str, thread: str) -> int:
        pid = self.pid(process)
        key = (process, thread)
        if key not in self.tids:
            tid = self.tids[key] = len(self.tids) + 1
            self.metadata.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": thread}})
            self.metadata.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                  "args": {"sort_index": tid}})
        return self.tids[key]


@attrs.define
class _Slice:
    request_id: Any
    stage: str
    process: str
    start_ns: int
    end_ns: int
    status: str
    error: str | None = None
    terminal: bool = False
    next: list[str] | None = None
    lane: str = ""


def _stage_slices(events: Sequence[dict[str, Any]]) -> list[_Slice]:
    open_: dict[tuple[Any, str], dict[str, Any]] = {}
    slices: list[_Slice] = []
    for event in events:
        name = event.get("event")
        if name not in ("stage_dispatch", "stage_complete", "stage_failed"):
            continue
        key = (event.get("request_id"), stage_key(event))
        if name == "stage_dispatch":
            open_[key] = event
            continue
        begin = open_.pop(key, None)
        if begin is None:
            continue
        slices.append(_Slice(
            request_id=key[0], stage=key[1], process=str(begin.get("process", "")),
            start_ns=int(begin["ts_ns"]), end_ns=int(event["ts_ns"]),
            status="complete" if name == "stage_complete" else "failed",
            error=event.get("error"), terminal=bool(event.get("terminal", False)),
            next=[str(n) for n in event["next"]] if isinstance(event.get("next"), list) else None,
        ))
    return slices


def _assign_lanes(slices: list[_Slice]) -> None:
    """Put each slice on its stage's track; overlapping requests (a batch) get extra tracks ``stage (2)``, ..."""
    lanes: dict[tuple[str, str], list[int]] = {}  # (process, stage) -> end time of each lane
    for item in sorted(slices, key=lambda s: (s.start_ns, s.end_ns)):
        ends = lanes.setdefault((item.process, item.stage), [])
        for index, end in enumerate(ends):
            if end <= item.start_ns:
                ends[index] = item.end_ns
                break
        else:
            index = len(ends)
            ends.append(item.end_ns)
        item.lane = item.stage if index == 0 else f"{item.stage} ({index + 1})"


def chrome_trace(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A Chrome/Perfetto trace-event document for ``events`` (open it in ui.perfetto.dev or chrome://tracing).

    One process track per OS process (so one per replica), one thread track
    per stage (``voc@r1`` in a replica; plus one per extra concurrent request in a stage), a complete slice per request
    per stage (``stage_dispatch`` to ``stage_complete`` or ``stage_failed``),
    flow arrows from a stage's completion to the next stage's dispatch of the
    same request, stream chunks that crossed processes as instant events, and
    an async slice per request on the coordinator's process. Times are
    microseconds since the first event.
    """
    stamps = [int(event["ts_ns"]) for event in events if "ts_ns" in event]
    origin = min(stamps) if stamps else 0
    tracks = _Tracks()
    out: list[dict[str, Any]] = []

    def us(ts_ns: int) -> float:
        return round((ts_ns - origin) / 1000.0, 3)

    # Processes in order of appearance, so pids follow the trace.
    for event in events:
        tracks.pid(str(event.get("process", "")))

    slices = _stage_slices(events)
    _assign_lanes(slices)
    for item in slices:
        args: dict[str, Any] = {"request_id": item.request_id, "stage": item.stage, "status": item.status}
        if item.error is not None:
            args["error"] = item.error
        out.append({
            "ph": "X", "name": str(item.request_id), "cat": "stage",
            "pid": tracks.pid(item.process), "tid": tracks.tid(item.process, item.lane),
            "ts": us(item.start_ns), "dur": max(0.0, round((item.end_ns - item.start_ns) / 1000.0, 3)),
            "args": args,
        })

    out += _flows(slices, tracks, us)
    out += _instants(events, tracks, us)
    out += _request_spans(events, tracks, us)
    return {"traceEvents": tracks.metadata + out, "displayTimeUnit": "ms"}


def _flows(slices: list[_Slice], tracks: _Tracks, us: Any) -> list[dict[str, Any]]:
    """Arrows from each completed slice to the slice of the same request that next started in another stage.

    A ``stage_complete`` that names its ``next`` stages gets one arrow per
    stage it named (a fan-out); a terminal one gets none.
    """
    out: list[dict[str, Any]] = []
    flow_id = 0
    by_request: dict[Any, list[_Slice]] = {}
    for item in slices:
        by_request.setdefault(item.request_id, []).append(item)
    for source in slices:
        if source.status != "complete" or source.terminal:
            continue
        later = sorted(
            (s for s in by_request[source.request_id] if s.stage != source.stage and s.start_ns >= source.end_ns),
            key=lambda s: s.start_ns,
        )
        if source.next is not None:
            firsts: dict[str, _Slice] = {}
            for item in later:
                if item.stage in source.next:
                    firsts.setdefault(item.stage, item)
            targets = list(firsts.values())
        else:
            targets = later[:1]
        for target in targets:
            flow_id += 1
            common = {"name": "handoff", "cat": "flow", "id": flow_id}
            # The start sits just inside the source slice so that viewers bind it to that slice.
            start_ts = round(max(us(source.start_ns), us(source.end_ns) - 0.001), 3)
            out.append({**common, "ph": "s", "pid": tracks.pid(source.process),
                        "tid": tracks.tid(source.process, source.lane), "ts": start_ts})
            out.append({**common, "ph": "f", "bp": "e", "pid": tracks.pid(target.process),
                        "tid": tracks.tid(target.process, target.lane), "ts": us(target.start_ns)})
    return out


def _instants(events: Sequence[dict[str, Any]], tracks: _Tracks, us: Any) -> list[dict[str, Any]]:
    """Stream chunks that crossed processes, on the sending stage's (or reading stage's) track."""
    out: list[dict[str, Any]] = []
    for event in events:
        name = event.get("event")
        if name not in ("comm_stream_send", "comm_stream_read"):
            continue
        process = str(event.get("process", ""))
        sending = name == "comm_stream_send"
        thread = str(event.get("from_stage" if sending else "to_stage", COORDINATOR))
        verb = "send" if sending else "read"
        args = {key: value for key, value in event.items() if key not in ("event", "ts_ns", "process")}
        out.append({
            "ph": "i", "s": "t", "cat": "stream",
            "name": f"{_chunk_label(event)} {verb} {event.get('from_stage')}->{event.get('to_stage')}",
            "pid": tracks.pid(process), "tid": tracks.tid(process, thread), "ts": us(int(event["ts_ns"])),
            "args": args,
        })
    return out


def _chunk_label(event: dict[str, Any]) -> str:
    """``chunk 3``, or ``chunks 3-9`` for a run of chunks that travelled as one message."""
    first, count = event.get("chunk_id"), event.get("chunk_count", 1)
    if isinstance(first, int) and isinstance(count, int) and count > 1:
        return f"chunks {first}-{first + count - 1}"
    return f"chunk {first}"


def _request_spans(events: Sequence[dict[str, Any]], tracks: _Tracks, us: Any) -> list[dict[str, Any]]:
    """An async slice per request, from ``request_submitted`` to its end event, on the coordinator's process."""
    out: list[dict[str, Any]] = []
    open_: dict[Any, tuple[dict[str, Any], int]] = {}
    span_id = 0
    for event in events:
        name = event.get("event")
        request_id = event.get("request_id")
        if name == "request_submitted":
            span_id += 1
            open_[request_id] = (event, span_id)
        elif name in REQUEST_END and request_id in open_:
            begin, ident = open_.pop(request_id)
            process = str(begin.get("process", ""))
            common = {"name": str(request_id), "cat": "request", "id": ident,
                      "pid": tracks.pid(process), "tid": tracks.tid(process, COORDINATOR)}
            out.append({**common, "ph": "b", "ts": us(int(begin["ts_ns"])), "args": {"entry": begin.get("stage")}})
            end_args = {"status": REQUEST_END[name]}
            for key in ("error", "reason"):
                if key in event:
                    end_args[key] = str(event[key])
            out.append({**common, "ph": "e", "ts": us(int(event["ts_ns"])), "args": end_args})
    return out
