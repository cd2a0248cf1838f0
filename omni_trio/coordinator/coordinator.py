"""The coordinator: admits requests, collects their results, aborts them.

It owns every live request: a request is admitted once (a live id cannot
be reused), resolved exactly once (result, failure, abort or timeout), and
every failure is broadcast as an abort so no stage keeps state for it
(fast-fail). Stages report back through :meth:`Coordinator.on_complete` and
:meth:`Coordinator.on_stream`, called directly in-process or by the runtime's
:mod:`~omni_trio.runtime.stage_reports`.

Only the runtime holds the coordinator (its hooks: stage reports, worker deaths, shutdown); the
caller holds a :class:`~omni_trio.coordinator.pipeline.Pipeline`, which offers the caller's methods
(submit, stream, abort, session, stats, health) and delegates them here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection
from typing import Any

import outcome
import trio

from omni_trio.config import PipelineConfig
from omni_trio.coordinator.aborts_under_way import AbortsUnderWay
from omni_trio.coordinator.live_request import END_OF_STREAM, LiveRequest
from omni_trio.coordinator.placement import Placement
from omni_trio.coordinator.replicas import ReplicaDispatcher
from omni_trio.coordinator.request_stream import RequestStream
from omni_trio.coordinator.request_targets import RequestTargets, make_request
from omni_trio.coordinator.send_pacing import SendPacing
from omni_trio.coordinator.sessions import Session
from omni_trio.coordinator.stats import PipelineHealth, PipelineStats
from omni_trio.coordinator.stream_admission import StreamAdmission
from omni_trio.coordinator.stream_backlog import StreamBacklog, event_bytes
from omni_trio.errors import (
    DuplicateRequestId,
    PipelineClosed,
    QueueFullError,
    RequestAborted,
    RequestError,
    RequestFailed,
    RequestQueueFull,
    RequestTimeout,
    describe_error,
)
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.payload import StagePayload
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.tracing.trace import Tracer, get_logger

log = get_logger(__name__)


class Coordinator:
    """Owns the live requests of one pipeline (see the module docstring)."""

    def __init__(
        self,
        config: PipelineConfig,
        placement: Placement,
        tracer: Tracer,
        nursery: trio.Nursery,
        replicas: ReplicaDispatcher | None = None,
    ) -> None:
        self._entry = config.entry
        self._targets = RequestTargets(config)
        self._placement = placement
        self._tracer = tracer
        self._nursery = nursery
        self._live: dict[str, LiveRequest] = {}
        self._aborts = AbortsUnderWay(placement)
        self._pacing = SendPacing(nursery)
        self._closed: str | None = None
        self._max_in_flight = config.max_in_flight
        self._rejected = 0
        self._stream_admission = StreamAdmission(config.stream_admission)
        self._refused_streams = 0
        self._backlog = StreamBacklog(config.stream_delivery.max_total_backlog_bytes)
        #: Binds each request to a replica of every replicated group (None: there is none).
        self._replicas = replicas or None

    # ------------------------------------------------------------------ admission

    def _admit(
        self,
        request_id: str,
        inputs: Any,
        params: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
        *,
        streaming: bool,
        deadline: float | None,
    ) -> LiveRequest:
        if self._closed is not None:
            raise PipelineClosed(f"the pipeline accepts no more requests: {self._closed}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request ids are non-empty strings, got {request_id!r}")
        if request_id in self._live or request_id in self._aborts:
            raise DuplicateRequestId(request_id)
        if self._max_in_flight is not None and len(self._live) >= self._max_in_flight:
            self._rejected += 1
            if self._tracer.enabled:
                self._tracer.event("request_rejected", request_id=request_id, stage="coordinator")
            raise QueueFullError(
                f"request {request_id!r} refused: {len(self._live)} requests are in flight "
                f"(max_in_flight={self._max_in_flight}); retry when one finishes"
            )
        request = make_request(inputs, params, metadata)
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
        session = SessionOperation.from_request(request)
        # A session's operations belong to a session already open: only a new stream of its own is admitted.
        playback = streaming and session is None
        if playback:
            self._admit_stream(request_id)
        entry_stages, expected = self._targets.of(request, session)
        live = LiveRequest(request_id, request, expected, streaming, session=session, entry_stages=entry_stages)
        if self._replicas is not None:
            self._replicas.bind(request_id, request)
        if streaming:
            live.events, live.received = trio.open_memory_channel[Any](math.inf)
            self._backlog.started(live)
        if playback:
            self._stream_admission.started(request_id)
        self._live[request_id] = live
        if deadline is not None:
            live.deadline_scope = trio.CancelScope(deadline=trio.current_time() + deadline)
            self._nursery.start_soon(self._expire, live, live.deadline_scope, deadline)
        if self._tracer.enabled:
            self._tracer.event("request_submitted", request_id=request_id, stage=self._entry)
        return live

    def _admit_stream(self, request_id: str) -> None:
        """Refuse a new stream when the live ones cannot keep real time (``config.stream_admission``)."""
        refusal = self._stream_admission.refusal(trio.current_time())
        if refusal is None:
            return
        self._refused_streams += 1
        if self._tracer.enabled:
            self._tracer.event("stream_refused", request_id=request_id, stage="coordinator", reason=refusal)
        raise QueueFullError(f"stream {request_id!r} refused: {refusal}")

    def _declared(self, live: LiveRequest, seconds: float) -> None:
        """The reader of ``live``'s stream sent ``seconds`` of playback (see ``RequestStream.declare_playback``)."""
        if not live.done.is_set():
            self._stream_admission.declared(live.request_id, trio.current_time(), seconds)

    async def _send_or_fail(self, live: LiveRequest) -> None:
        """Send the request's submits; a failure to send (a payload over ``slot_size_mb``, a tensor that
        cannot travel) fails the request, traced as a failure, instead of surfacing as a bare error and
        an abort "cancelled by its caller"."""
        await self._pacing.turn(live)
        if live.done.is_set():
            return  # aborted (or failed) while it waited for its turn: it never leaves this process
        live.sent = True
        try:
            await self._send_submit(live)
        except Exception as exc:  # noqa: BLE001 - becomes the request's RequestFailed, its caller sees it
            self.on_complete(live.request_id, "coordinator", error=f"sending the request: {describe_error(exc)}")

    async def _send_submit(self, live: LiveRequest) -> None:
        if live.session is not None:
            for preempted in live.session.preempted_request_ids:
                if preempted in self._live and preempted != live.request_id:
                    await self.abort(preempted)
        for stage in live.entry_stages:
            # One payload per stage: a stage's compute may replace its data in place.
            payload = StagePayload(live.request_id, live.request, {"raw_inputs": live.request.inputs})
            await self._placement.submit(stage, payload)

    # ------------------------------------------------------------------ the caller's (through Pipeline)

    async def submit(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """:meth:`omni_trio.Pipeline.submit`, which says what it promises the caller."""
        live = self._admit(request_id, inputs, params, metadata, streaming=False, deadline=deadline)
        try:
            await self._send_or_fail(live)
            if live.sent or not live.done.is_set():
                await live.done.wait()
            # else: resolved while it waited for its turn (a checkpoint): no second pass to learn that
        finally:
            # Shielded, and only where there is something to wait for (a cancel scope per request
            # is a measurable share of an abort storm's passes).
            if not live.done.is_set():
                await self._abort(live, RequestAborted(request_id, "cancelled by its caller"))
            if request_id in self._aborts:
                with trio.CancelScope(shield=True):
                    await self._aborts.settled(request_id)
        assert live.result is not None
        return live.result.unwrap()

    def stream(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> RequestStream:
        """:meth:`omni_trio.Pipeline.stream`, which says what it promises the caller."""
        return RequestStream(
            request_id,
            admit=functools.partial(
                self._admit, request_id, inputs, params, metadata, streaming=True, deadline=deadline
            ),
            send=self._send_or_fail,
            abort=self._abort_now,
            # A failed request's abort broadcast: once the caller hears of the failure, no stage
            # holds anything for the request.
            settled=self._aborts.settled,
            taken=self._backlog.taken,
            dropped=self._backlog.dropped,
            declared=self._declared,
        )

    async def abort(self, request_id: str) -> bool:
        """Abort a live request everywhere; False if it is unknown or already finished."""
        live = self._live.get(request_id)
        if live is None:
            with trio.CancelScope(shield=True):
                await self._aborts.settled(request_id)
            return False
        await self._abort(live, RequestAborted(request_id))
        return True

    def session(self, session_id: str, *, stages: list[str]) -> Session:
        """:meth:`omni_trio.Pipeline.session`, which says what it promises the caller."""
        return Session(self, session_id, stages)

    async def stats(self, *, timeout: float | None = None) -> PipelineStats:
        """Counters of every stage and of the coordinator.

        Raises :class:`~omni_trio.StatsTimeout`, naming the processes, when a worker process does not
        answer within ``timeout`` seconds (default 10).
        """
        # The replicas that are down when the stages are asked, not after: a restart may end meanwhile.
        down_replicas = () if self._replicas is None else self._replicas.down()
        return PipelineStats(
            stages=await self._placement.stats(timeout),
            live_requests=len(self._live),
            rejected_requests=self._rejected,
            refused_streams=self._refused_streams,
            down_replicas=down_replicas,
            refused_frames=self._placement.refused_frames(),
            refused_connections=self._placement.refused_connections(),
            undeliverable=self._placement.undeliverable(),
            superseded_messages=self._placement.superseded_messages(),
            sent_bytes=self._placement.sent_bytes(),
            stream_backlog_bytes=self._backlog.total,
        )

    def live_request_ids(self) -> set[str]:
        """The ids of the requests live now (admitted, not resolved)."""
        return set(self._live)

    def health(self) -> PipelineHealth:
        """Whether every stage process is alive and ready; a closed pipeline has none ready."""
        processes = self._placement.health()
        if self._closed is not None:
            processes = dict.fromkeys(processes, "dead")
        return PipelineHealth(processes)

    # ------------------------------------------------------------------ resolution

    async def _abort(self, live: LiveRequest, error: RequestError) -> None:
        """Resolve ``live`` with ``error`` and abort it everywhere, then wait until that is done, shielded:
        an abort goes on whatever happens to the task that asked for it."""
        done = self._abort_now(live, error)
        if done.is_set():
            # It never left this process: its abort is complete, so return without a schedule point (a
            # burst of aborts due together would each wait for the rest of the burst's pass otherwise).
            return
        with trio.CancelScope(shield=True):
            await done.wait()

    def _abort_now(self, live: LiveRequest, error: RequestError) -> trio.Event:
        """Resolve ``live`` with ``error`` and start its abort everywhere; the event fires once that is done."""
        if self._tracer.enabled:
            self._tracer.event("request_aborted", request_id=live.request_id, stage="coordinator", reason=str(error))
        self._resolve(live, outcome.Error(error))
        return self._abort_everywhere(live)

    def _abort_everywhere(self, live: LiveRequest) -> trio.Event:
        """Start telling every stage to drop ``live`` (resolved already); the event fires once they did.

        A request that never began sending (it waited for its turn, see ``send_pacing``) is in no
        stage: nothing is sent, and its abort is done at once.
        """
        if live.sent:
            return self._aborts.start(live.request_id)
        nothing_to_do = trio.Event()
        nothing_to_do.set()
        return nothing_to_do

    def _resolve(self, live: LiveRequest, result: outcome.Outcome[Any]) -> None:
        """Settle a request exactly once and forget it."""
        if live.done.is_set():
            return
        live.result = result
        live.done.set()
        self._pacing.leave(live)
        self._live.pop(live.request_id, None)
        if self._replicas is not None:
            self._replicas.release(live.request_id)
        if live.deadline_scope is not None:
            live.deadline_scope.cancel()
        if live.streaming:
            self._stream_admission.ended(live.request_id)
            self._queue(live, result.error if isinstance(result, outcome.Error) else END_OF_STREAM, 0)

    def _queue(self, live: LiveRequest, event: Any, nbytes: int) -> None:
        """Put ``event`` (weighing ``nbytes``) into ``live``'s stream; fail the idlest streams if that
        puts the unread total over ``stream_delivery.max_total_backlog_bytes``."""
        live.events.send_nowait(event)
        if self._backlog.queued(live, nbytes):
            self._fail_idlest_streams()

    def _fail_idlest_streams(self) -> None:
        for live in self._backlog.to_fail():
            error = self._backlog.fail(live)
            if live.done.is_set():
                self._queue(live, error, 0)  # resolved already: its reader gets the failure instead of the rest
            else:
                self._resolve(live, outcome.Error(error))
                self._abort_everywhere(live)

    async def _expire(self, live: LiveRequest, scope: trio.CancelScope, seconds: float) -> None:
        with scope:
            await trio.sleep_forever()
        if not live.done.is_set():
            await self._abort_now(live, RequestTimeout(live.request_id, seconds)).wait()

    # ------------------------------------------------------------------ stage reports

    def on_complete(
        self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None, refused: bool = False
    ) -> None:
        """A stage reported a terminal result, or a failure (``error`` set; ``refused``: for lack of room)."""
        live = self._live.get(request_id)
        if live is None:
            return
        if error is not None:
            if self._tracer.enabled:
                self._tracer.event("request_failed", request_id=request_id, stage=from_stage, error=error)
            failure = RequestQueueFull if refused else RequestFailed
            self._resolve(live, outcome.Error(failure(request_id, from_stage, error)))
            self._aborts.start(request_id)
            return
        if from_stage not in live.expected:
            return
        if live.streaming:
            self._queue(live, CompleteMessage(request_id, from_stage, True, result), event_bytes(result))
        if len(live.expected) == 1:
            final = result
        else:
            live.partial[from_stage] = result
            if len(live.partial) < len(live.expected):
                return
            final = {stage: live.partial[stage] for stage in sorted(live.expected)}
        if self._tracer.enabled:
            self._tracer.event("request_completed", request_id=request_id, stage=from_stage)
        self._resolve(live, outcome.Value(final))

    def on_stream(self, request_id: str, from_stage: str, chunk: Any, chunk_id: int, modality: str | None) -> None:
        """A terminal stage streamed a chunk; queue it for a streaming caller."""
        live = self._live.get(request_id)
        if live is not None and live.streaming:
            message = StreamMessage(request_id, from_stage, chunk, modality=modality, chunk_id=chunk_id)
            self._stream_admission.arrived(request_id, trio.current_time(), modality)
            self._queue(live, message, event_bytes(chunk))

    def retire_unknown(self, request_ids: Collection[str]) -> list[str]:
        """Stages hold ``request_ids``: abort everywhere those this coordinator no longer knows.

        The abort safety net (see :mod:`omni_trio.control.audit`). An id is unknown when it is
        neither live nor being aborted: its request was resolved, so nobody waits for what the
        stages still do with it. Returns those ids.
        """
        unknown = [rid for rid in request_ids if rid not in self._live and rid not in self._aborts]
        if unknown:
            log.info("stale_requests_retired", count=len(unknown), request_ids=unknown[:8])
        for request_id in unknown:
            self._aborts.start(request_id)
        return unknown

    # ------------------------------------------------------------------ shutdown

    def fail_all(
        self,
        error_for: Callable[[str], RequestError],
        *,
        abort_everywhere: bool = False,
        only: set[str] | None = None,
    ) -> None:
        """Resolve every live request (or those in ``only``) with ``error_for(request_id)`` (e.g. a dead process).

        With ``abort_everywhere`` (the pipeline goes on serving) each one is also aborted in every
        process, and its caller hears of the failure once that is done, as for any failure.
        """
        for live in list(self._live.values()):
            if only is not None and live.request_id not in only:
                continue
            self._resolve(live, outcome.Error(error_for(live.request_id)))
            if abort_everywhere:
                self._abort_everywhere(live)

    async def close(self, reason: str = "the pipeline closed") -> None:
        """Refuse new requests, abort every live one everywhere, wait for the broadcasts."""
        self._closed = reason
        with trio.CancelScope(shield=True):
            for live in list(self._live.values()):
                await self._abort(live, RequestAborted(live.request_id, f"aborted: {reason}"))
            await self._aborts.wait_all()
