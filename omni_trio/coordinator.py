"""The coordinator: admits requests, collects their results, aborts them.

It owns every live request: a request is admitted once (a live id cannot
be reused), resolved exactly once (result, failure, abort or timeout), and
every failure is broadcast as an abort so no stage keeps state for it
(fast-fail). Stages report back through :meth:`Coordinator.on_complete` and
:meth:`Coordinator.on_stream`, called directly in-process or by the control
plane.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol

import attrs
import outcome
import trio

from omni_trio.comm.router import COORDINATOR
from omni_trio.config import PipelineConfig, import_string
from omni_trio.errors import (
    QUEUE_FULL_TEXT,
    DuplicateRequestId,
    PipelineClosed,
    QueueFullError,
    RequestAborted,
    RequestError,
    RequestFailed,
    RequestQueueFull,
    RequestTimeout,
)
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.payload import OmniRequest, StagePayload
from omni_trio.replicas import ReplicaDispatcher
from omni_trio.scheduling.session import SessionOperation
from omni_trio.sessions import Session, session_targets
from omni_trio.stage.replicas import logical_name
from omni_trio.stage.stage import StageStats, describe_error
from omni_trio.tracing import Tracer, get_logger

log = get_logger(__name__)


class StageDirectory(Protocol):
    """How the coordinator reaches stages, wherever they run."""

    async def submit(self, stage: str, payload: StagePayload) -> None:
        """Deliver a new request to ``stage`` (the entry stage)."""

    def abort(self, request_id: str) -> Awaitable[None]:
        """Start telling every stage to drop ``request_id`` (at once: nothing waits in a task before
        the abort is on its way); await the result to wait until every stage did."""

    async def stats(self, timeout: float | None = None) -> dict[str, StageStats]:
        """Every stage's counters; :class:`~omni_trio.StatsTimeout` when a process does not answer in ``timeout`` s."""

    def sent_bytes(self) -> dict[str, dict[str, int]]:
        """Tensor bytes the coordinator sent (submitted inputs): ``{entry stage: {transport: bytes}}``."""

    def health(self) -> dict[str, str]:
        """The state of each process that runs stages (see :class:`PipelineHealth`)."""

    def refused_frames(self) -> dict[str, int]:
        """Per process, the messages refused for want of the run's proof (none without sockets)."""


@attrs.frozen
class PipelineHealth:
    """Whether every process of a pipeline is alive and ready to take requests.

    ``processes`` maps each process (``"main"`` for the caller's) to
    ``"ready"``, ``"starting"``, ``"restarting"`` or ``"dead"``.
    """

    processes: dict[str, str]

    @property
    def ok(self) -> bool:
        """True when every process is ready."""
        return all(state == "ready" for state in self.processes.values())

    def not_ready(self) -> dict[str, str]:
        """The processes that are not ready, with their state."""
        return {name: state for name, state in self.processes.items() if state != "ready"}


@attrs.frozen
class PipelineStats:
    """Counters of a whole pipeline: per stage, plus requests the coordinator holds."""

    stages: dict[str, StageStats]
    live_requests: int
    rejected_requests: int = 0  # refused at admission by max_in_flight, since the pipeline opened
    #: Replica processes that take no work now (dead, or being restarted).
    down_replicas: tuple[str, ...] = ()
    #: Per process, the messages its sockets refused and dropped undecoded: they lacked this run's
    #: proof (forged, garbage, from another run); empty when every stage is embedded.
    refused_frames: dict[str, int] = attrs.field(factory=dict)
    #: Tensor bytes the coordinator sent (submitted inputs), ``{entry stage: {transport: bytes}}``, since
    #: the pipeline opened (the stages' own sends are their :attr:`StageStats.sent_bytes`).
    sent_bytes: dict[str, dict[str, int]] = attrs.field(factory=dict, hash=False)

    @property
    def degraded(self) -> bool:
        """True while a replica is down: the pipeline serves, with fewer replicas."""
        return bool(self.down_replicas)

    @property
    def idle(self) -> bool:
        """True when no request is held anywhere."""
        return self.live_requests == 0 and all(stage.idle for stage in self.stages.values())

    @property
    def busy_seconds(self) -> dict[str, float]:
        """Compute-seconds per stage name, summed over its replicas (see :attr:`StageStats.busy_seconds`)."""
        busy: dict[str, float] = {}
        for address, stage in self.stages.items():
            name = logical_name(address)
            busy[name] = busy.get(name, 0.0) + stage.busy_seconds
        return busy

    @property
    def edge_bytes(self) -> dict[tuple[str, str, str], int]:
        """Tensor bytes per ``(from_stage, to_stage, transport)``, replicas merged into their stage;
        ``"coordinator"`` is the caller's side: ``from_stage`` for submitted inputs, ``to_stage`` for
        results and chunks (see :attr:`StageStats.sent_bytes`)."""
        edges: dict[tuple[str, str, str], int] = {}
        senders = [(COORDINATOR, self.sent_bytes)] + [(a, stage.sent_bytes) for a, stage in self.stages.items()]
        for address, sent in senders:
            for receiver, by_transport in sent.items():
                for transport, nbytes in by_transport.items():
                    key = (logical_name(address), logical_name(receiver), transport)
                    edges[key] = edges.get(key, 0) + nbytes
        return edges

    @property
    def stuck(self) -> dict[str, dict[str, float]]:
        """Stages with computes still running for requests nobody waits for: stage -> its ``StageStats.stuck``."""
        return {name: stage.stuck for name, stage in sorted(self.stages.items()) if stage.stuck}


_END_OF_STREAM = object()


@attrs.define(eq=False)
class _LiveRequest:
    request_id: str
    request: OmniRequest
    expected: frozenset[str]
    streaming: bool
    done: trio.Event = attrs.field(factory=trio.Event)
    result: outcome.Outcome[Any] | None = None
    partial: dict[str, Any] = attrs.field(factory=dict)
    deadline_scope: trio.CancelScope | None = None
    events: Any = None  # send side of the streaming caller's channel
    received: Any = None  # its receive side
    session: SessionOperation | None = None
    entry_stages: tuple[str, ...] = ()  # where the Submit goes (several for a session's open/close/control)


class Coordinator:
    """Owns the live requests of one pipeline (see the module docstring)."""

    def __init__(
        self,
        config: PipelineConfig,
        directory: StageDirectory,
        tracer: Tracer,
        nursery: trio.Nursery,
        replicas: ReplicaDispatcher | None = None,
    ) -> None:
        self._entry = config.entry
        self._stage_names = frozenset(stage.name for stage in config.stages)
        self._replicated = frozenset(stage.name for stage in config.stages if stage.replicas > 1)
        self._terminals = frozenset(config.terminal_stages)
        self._terminals_fn: Callable[[OmniRequest], Any] | None = (
            None if config.terminal_stages_fn is None else import_string(config.terminal_stages_fn)
        )
        self._directory = directory
        self._tracer = tracer
        self._nursery = nursery
        self._live: dict[str, _LiveRequest] = {}
        self._aborting: dict[str, trio.Event] = {}
        self._closed: str | None = None
        self._max_in_flight = config.max_in_flight
        self._rejected = 0
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
    ) -> _LiveRequest:
        if self._closed is not None:
            raise PipelineClosed(f"the pipeline accepts no more requests: {self._closed}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request ids are non-empty strings, got {request_id!r}")
        if request_id in self._live or request_id in self._aborting:
            raise DuplicateRequestId(request_id)
        if self._max_in_flight is not None and len(self._live) >= self._max_in_flight:
            self._rejected += 1
            if self._tracer.enabled:
                self._tracer.event("request_rejected", request_id=request_id, stage="coordinator")
            raise QueueFullError(
                f"request {request_id!r} refused: {len(self._live)} requests are in flight "
                f"(max_in_flight={self._max_in_flight}); retry when one finishes"
            )
        if isinstance(inputs, OmniRequest):
            if params is not None or metadata is not None:
                raise ValueError("pass params and metadata inside the OmniRequest, not beside it")
            request = inputs
        else:
            request = OmniRequest(inputs, dict(params or {}), dict(metadata or {}))
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
        session = SessionOperation.from_request(request)
        if session is None:
            entry_stages: tuple[str, ...] = (self._entry,)
            expected = self._expected_terminals(request)
        else:
            entry_stages, completing = session_targets(session, self._stage_names, self._replicated)
            expected = frozenset(completing)
        live = _LiveRequest(request_id, request, expected, streaming, session=session, entry_stages=entry_stages)
        if self._replicas is not None:
            self._replicas.bind(request_id, request)
        if streaming:
            live.events, live.received = trio.open_memory_channel[Any](math.inf)
        self._live[request_id] = live
        if deadline is not None:
            live.deadline_scope = trio.CancelScope(deadline=trio.current_time() + deadline)
            self._nursery.start_soon(self._expire, live, live.deadline_scope, deadline)
        if self._tracer.enabled:
            self._tracer.event("request_submitted", request_id=request_id, stage=self._entry)
        return live

    def _expected_terminals(self, request: OmniRequest) -> frozenset[str]:
        if self._terminals_fn is None:
            return self._terminals
        answer = self._terminals_fn(request)
        if answer is None:
            return self._terminals
        chosen = frozenset([answer] if isinstance(answer, str) else answer)
        if not chosen or not chosen <= self._terminals:
            raise ValueError(
                f"terminal_stages_fn returned {sorted(chosen)!r}; it must be a non-empty subset of "
                f"the terminal stages {sorted(self._terminals)!r}"
            )
        return chosen

    async def _send_or_fail(self, live: _LiveRequest) -> None:
        """Send the request's submits; a failure to send (a payload over ``slot_size_mb``, a tensor that
        cannot travel) fails the request, traced as a failure, instead of surfacing as a bare error and
        an abort "cancelled by its caller"."""
        try:
            await self._send_submit(live)
        except Exception as exc:  # noqa: BLE001 - becomes the request's RequestFailed, its caller sees it
            self.on_complete(live.request_id, "coordinator", error=f"sending the request: {describe_error(exc)}")

    async def _send_submit(self, live: _LiveRequest) -> None:
        if live.session is not None:
            for preempted in live.session.preempted_request_ids:
                if preempted in self._live and preempted != live.request_id:
                    await self.abort(preempted)
        for stage in live.entry_stages:
            # One payload per stage: a stage's compute may replace its data in place.
            payload = StagePayload(live.request_id, live.request, {"raw_inputs": live.request.inputs})
            await self._directory.submit(stage, payload)

    # ------------------------------------------------------------------ public API

    async def submit(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Run one request to completion and return its terminal result.

        With several terminal stages the result is a dict keyed by stage
        name. Raises :class:`RequestFailed`, :class:`RequestAborted`,
        :class:`RequestTimeout` (``deadline`` seconds passed; the request is
        aborted everywhere) or :class:`DuplicateRequestId`. Cancelling the
        caller aborts the request.
        """
        live = self._admit(request_id, inputs, params, metadata, streaming=False, deadline=deadline)
        try:
            await self._send_or_fail(live)
            await live.done.wait()
        finally:
            with trio.CancelScope(shield=True):
                if not live.done.is_set():
                    await self._abort(live, RequestAborted(request_id, "cancelled by its caller"))
                await self._settled(request_id)
        assert live.result is not None
        return live.result.unwrap()

    async def _settled(self, request_id: str) -> None:
        """Wait for a failed request's abort broadcast: once the caller hears of the
        failure, no stage holds anything for the request."""
        pending = self._aborting.get(request_id)
        if pending is not None:
            await pending.wait()

    def stream(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> RequestStream:
        """Run one request and iterate over its stream chunks and completions.

        Use as ``async with pipeline.stream(...) as events: async for ev in
        events``: leaving the block early, however, aborts the request before
        the block is left. Directly as ``async for ev in pipeline.stream(...)``,
        a loop left early aborts the request only once the stream object is
        garbage-collected (at once in CPython, unless something still refers to
        it), without waiting for the abort. Yields
        :class:`StreamMessage` and :class:`CompleteMessage` objects; ends after
        the last terminal stage completed; raises the request's error.
        """
        return RequestStream(self, request_id, inputs, params, metadata, deadline)

    async def abort(self, request_id: str) -> bool:
        """Abort a live request everywhere; False if it is unknown or already finished."""
        live = self._live.get(request_id)
        if live is None:
            pending = self._aborting.get(request_id)
            if pending is not None:
                with trio.CancelScope(shield=True):
                    await pending.wait()
            return False
        with trio.CancelScope(shield=True):
            await self._abort(live, RequestAborted(request_id))
        return True

    def session(self, session_id: str, *, stages: list[str]) -> Session:
        """A session whose state lives in ``stages`` (its owner stages, in pipeline order).

        Use as ``async with pipeline.session("s1", stages=["asr"]) as s:`` with
        ``await s.append(chunk)`` and ``async for ev in s.events()``; the block
        opens the session and closes it on exit, whatever the reason (see
        :class:`omni_trio.sessions.Session`).
        """
        return Session(self, session_id, stages)

    async def stats(self, *, timeout: float | None = None) -> PipelineStats:
        """Counters of every stage and of the coordinator.

        Raises :class:`~omni_trio.StatsTimeout`, naming the processes, when a worker process does not
        answer within ``timeout`` seconds (default 10).
        """
        # The replicas that are down when the stages are asked, not after: a restart may end meanwhile.
        down_replicas = () if self._replicas is None else self._replicas.down()
        return PipelineStats(
            stages=await self._directory.stats(timeout),
            live_requests=len(self._live),
            rejected_requests=self._rejected,
            down_replicas=down_replicas,
            refused_frames=self._directory.refused_frames(),
            sent_bytes=self._directory.sent_bytes(),
        )

    def live_request_ids(self) -> set[str]:
        """The ids of the requests live now (admitted, not resolved)."""
        return set(self._live)

    def health(self) -> PipelineHealth:
        """Whether every stage process is alive and ready; a closed pipeline has none ready."""
        processes = self._directory.health()
        if self._closed is not None:
            processes = dict.fromkeys(processes, "dead")
        return PipelineHealth(processes)

    # ------------------------------------------------------------------ resolution

    async def _abort(self, live: _LiveRequest, error: RequestError) -> None:
        await self._abort_now(live, error).wait()

    def _abort_now(self, live: _LiveRequest, error: RequestError) -> trio.Event:
        """Resolve ``live`` with ``error`` and start its abort everywhere; the event fires once that is done."""
        if self._tracer.enabled:
            self._tracer.event("request_aborted", request_id=live.request_id, stage="coordinator", reason=str(error))
        self._resolve(live, outcome.Error(error))
        return self._broadcast_abort(live.request_id)

    def _resolve(self, live: _LiveRequest, result: outcome.Outcome[Any]) -> None:
        """Settle a request exactly once and forget it."""
        if live.done.is_set():
            return
        live.result = result
        live.done.set()
        self._live.pop(live.request_id, None)
        if self._replicas is not None:
            self._replicas.release(live.request_id)
        if live.deadline_scope is not None:
            live.deadline_scope.cancel()
        if live.streaming:
            live.events.send_nowait(result.error if isinstance(result, outcome.Error) else _END_OF_STREAM)

    def _broadcast_abort(self, request_id: str) -> trio.Event:
        """Start (once) the abort broadcast of ``request_id``; the event fires when it is done."""
        done = self._aborting.get(request_id)
        if done is None:
            confirmed = self._directory.abort(request_id)
            done = self._aborting[request_id] = trio.Event()
            self._nursery.start_soon(self._run_broadcast, request_id, done, confirmed)
        return done

    async def _run_broadcast(self, request_id: str, done: trio.Event, confirmed: Awaitable[None]) -> None:
        try:
            # Shielded (the directory bounds it): an abort must reach every stage even
            # when the caller's scope, and with it this task, is being cancelled.
            with trio.CancelScope(shield=True):
                await confirmed
        except Exception as exc:  # noqa: BLE001 - a stage that kept the id is found by the safety net (control/audit.py)
            log.warning("abort_broadcast_failed", request_id=request_id, error=repr(exc))
        finally:
            del self._aborting[request_id]
            done.set()

    async def _expire(self, live: _LiveRequest, scope: trio.CancelScope, seconds: float) -> None:
        with scope:
            await trio.sleep_forever()
        if not live.done.is_set():
            await self._abort(live, RequestTimeout(live.request_id, seconds))

    # ------------------------------------------------------------------ stage reports

    def on_complete(self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None) -> None:
        """A stage reported a terminal result, or a failure (``error`` set)."""
        live = self._live.get(request_id)
        if live is None:
            return
        if error is not None:
            if self._tracer.enabled:
                self._tracer.event("request_failed", request_id=request_id, stage=from_stage, error=error)
            failure = RequestQueueFull if QUEUE_FULL_TEXT in error else RequestFailed
            self._resolve(live, outcome.Error(failure(request_id, from_stage, error)))
            self._broadcast_abort(request_id)
            return
        if from_stage not in live.expected:
            return
        if live.streaming:
            live.events.send_nowait(CompleteMessage(request_id, from_stage, True, result))
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
            live.events.send_nowait(StreamMessage(request_id, from_stage, chunk, modality=modality, chunk_id=chunk_id))

    def retire_unknown(self, request_ids: Collection[str]) -> list[str]:
        """Stages hold ``request_ids``: abort everywhere those this coordinator no longer knows.

        The abort safety net (see :mod:`omni_trio.control.audit`). An id is unknown when it is
        neither live nor being aborted: its request was resolved, so nobody waits for what the
        stages still do with it. Returns those ids.
        """
        unknown = [rid for rid in request_ids if rid not in self._live and rid not in self._aborting]
        if unknown:
            log.info("stale_requests_retired", count=len(unknown), request_ids=unknown[:8])
        for request_id in unknown:
            self._broadcast_abort(request_id)
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
                self._broadcast_abort(live.request_id)

    async def close(self, reason: str = "the pipeline closed") -> None:
        """Refuse new requests, abort every live one everywhere, wait for the broadcasts."""
        self._closed = reason
        with trio.CancelScope(shield=True):
            for live in list(self._live.values()):
                await self._abort(live, RequestAborted(live.request_id, f"aborted: {reason}"))
            while self._aborting:
                await next(iter(self._aborting.values())).wait()


class RequestStream:
    """The events of one streaming request (see :meth:`Coordinator.stream`)."""

    def __init__(
        self,
        coordinator: Coordinator,
        request_id: str,
        inputs: Any,
        params: dict[str, Any] | None,
        metadata: dict[str, Any] | None,
        deadline: float | None,
    ) -> None:
        self.request_id = request_id
        self._coordinator = coordinator
        self._args = (inputs, params, metadata, deadline)
        self._live: _LiveRequest | None = None
        self._finished = False
        self._token: trio.lowlevel.TrioToken | None = None

    async def _start(self) -> _LiveRequest:
        if self._live is None:
            inputs, params, metadata, deadline = self._args
            live = self._coordinator._admit(
                self.request_id, inputs, params, metadata, streaming=True, deadline=deadline
            )
            self._live = live
            self._token = trio.lowlevel.current_trio_token()
            try:
                await self._coordinator._send_or_fail(live)
            except BaseException:
                await self.aclose()
                raise
        return self._live

    async def __aenter__(self) -> RequestStream:
        await self._start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamMessage | CompleteMessage:
        live = await self._start()
        if self._finished:
            raise StopAsyncIteration
        try:
            event = await live.received.receive()
        except BaseException:
            await self.aclose()
            raise
        if event is _END_OF_STREAM:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(event, BaseException):
            self._finished = True
            with trio.CancelScope(shield=True):
                await self._coordinator._settled(self.request_id)
            raise event
        return event

    def __del__(self) -> None:
        # A bare ``async for`` left early (break, return, an exception in its body) never calls
        # aclose: the request would run on in the stages. Collected, the stream aborts it from the
        # trio loop (run_sync_soon may be called from __del__, on any thread).
        live = self._live
        if live is None or live.done.is_set() or self._token is None:
            return
        with contextlib.suppress(trio.RunFinishedError):  # the loop is gone, and the pipeline with it
            self._token.run_sync_soon(self._abort_dropped, live)

    def _abort_dropped(self, live: _LiveRequest) -> None:
        if live.done.is_set():
            return
        try:
            self._coordinator._abort_now(live, RequestAborted(self.request_id, "its stream was dropped unread"))
        except RuntimeError as exc:  # the pipeline is closing: its close aborts what is live
            log.warning("dropped_stream_abort_failed", request_id=self.request_id, error=repr(exc))

    async def aclose(self) -> None:
        """Stop reading; a request still running is aborted everywhere."""
        self._finished = True
        live = self._live
        if live is not None and not live.done.is_set():
            with trio.CancelScope(shield=True):
                await self._coordinator._abort(live, RequestAborted(self.request_id, "closed by its reader"))
