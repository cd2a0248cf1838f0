"""The stage: an IO shell around one scheduler, run as a trio nursery.

A stage receives work (a submit, upstream payloads, stream chunks and
signals), feeds its scheduler's inbox, and drains the scheduler's outbox into
its outbound side (:mod:`.outbound`), which routes each output: stream chunks
to stream targets, results to the next stages or to the coordinator. It never
branches on the scheduler's type and never knows whether a peer is in its own
process (see :mod:`.links`).

Failure isolation: an exception in user code or in routing fails the one
request it belongs to (a failure ``Complete`` to the coordinator, which
aborts the request everywhere); the stage keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

import trio

from omni_trio.comm.alloc import SlotAllocator
from omni_trio.comm.router import TransportLog
from omni_trio.config import StageConfig
from omni_trio.config.hooks import import_string
from omni_trio.config.replicas import replica_name
from omni_trio.control.bindings import BindingTable
from omni_trio.errors import QueueFullError, describe_error
from omni_trio.payload import StagePayload, StreamItem
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.idset import BoundedIdSet
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage, ResultOwner
from omni_trio.stage.abandoned import AbandonedComputes, ReportsComputes
from omni_trio.stage.inboxes import purge_inbox, queued_work
from omni_trio.stage.inputs import AggregatedInput, DirectInput, InputHandler
from omni_trio.stage.lifecycle import StageLifecycle
from omni_trio.stage.links import CoordinatorLink, StageLink
from omni_trio.stage.outbound import Outbound
from omni_trio.stage.routing import CompiledRouting, compile_routing
from omni_trio.stage.scopes import RequestScopes
from omni_trio.stage.sessions import SessionAdmission, session_operation
from omni_trio.stage.stats import StageStats
from omni_trio.tracing.trace import Tracer, get_logger

log = get_logger(__name__)

class StageEndpoint(Protocol):
    """What a stage asks of its process's endpoint (:class:`~omni_trio.control.endpoint.Endpoint`),
    when it has one: each call names the sending stage by its address."""

    def relay_in_use(self, sender: str) -> int:
        """Transfers ``sender`` sent that wait for their ACK."""

    def return_held_credits(self, sender: str, request_id: str) -> None:
        """``sender`` dropped ``request_id``: give back the credits its receivers hold for it."""

    def stage_idle(self) -> None:
        """A stage let go of the last request it held."""

    def allocator(self, sender: str) -> SlotAllocator:
        """Where ``ot.empty`` in ``sender``'s compute takes its slots."""


class Stage:
    """One pipeline stage: control of the request lifecycle around a scheduler.

    Peers are connected with :meth:`connect` before :meth:`run`. The
    ``deliver_*``/``on_submit``/``on_abort`` methods are the stage's inputs;
    same-process links call them directly, the multi-process runtime calls
    them after decoding a control message.
    """

    def __init__(
        self,
        config: StageConfig,
        scheduler: Any,
        *,
        process: str,
        tracer: Tracer,
        coordinator: CoordinatorLink,
        stream_receiver: bool,
        replica: int | None = None,
    ) -> None:
        self.name = config.name
        #: The replica index when the stage's group is replicated (its address is then ``name@r<replica>``).
        self.replica = replica
        self.config = config
        self.scheduler = scheduler
        self.process = process
        self.stream_receiver = stream_receiver
        self._tracer = tracer
        self._coordinator = coordinator
        self._routing: CompiledRouting = compile_routing(config)
        self._input: InputHandler = self._build_input(config)
        #: The scheduler takes a ``new_request`` through its own ``enqueue`` (else through its inbox).
        self._scheduler_enqueues = callable(getattr(scheduler, "enqueue", None))
        busy = getattr(scheduler, "busy", None)
        self._busy: BusyTime | None = busy if isinstance(busy, BusyTime) else None
        self._transports: TransportLog | None = None

        self.active: set[str] = set()
        self.aborted = BoundedIdSet()
        self._stream_open: set[str] = set()
        self._scopes = RequestScopes()
        self._endpoint: StageEndpoint | None = None
        self._bindings: BindingTable | None = None
        self._abandoned = AbandonedComputes(self.name, scheduler if isinstance(scheduler, ReportsComputes) else None)
        self._outbound = Outbound(
            self.name,
            self._routing,
            coordinator,
            tracer,
            self._scopes,
            stage=self,
            results=scheduler if isinstance(scheduler, ResultOwner) else None,
        )
        self._sessions = SessionAdmission(self.name, self._routing, self._scopes, self._outbound, stage=self)
        self._lifecycle = StageLifecycle(
            config, scheduler, outbound=self._outbound, abandoned=self._abandoned, stage=self
        )
        self._allocator: SlotAllocator | None = None

    @staticmethod
    def _build_input(config: StageConfig) -> InputHandler:
        if config.wait_for is None:
            return DirectInput()
        assert config.merge_fn is not None  # config validation guarantees it
        return AggregatedInput(
            config.wait_for,
            import_string(config.merge_fn),
            None if config.wait_for_fn is None else import_string(config.wait_for_fn),
        )

    def connect(
        self,
        links: dict[str, StageLink],
        transports: TransportLog,
        *,
        endpoint: StageEndpoint | None = None,
        bindings: BindingTable | None = None,
    ) -> None:
        """Give the stage its outgoing edges (one link per stage it may send to). ``transports`` is the
        log its links (and its coordinator link) note sends in, whose byte counts :meth:`stats` reports.

        With its process's ``endpoint`` (a multi-process run) the stage returns the credits of a
        request it drops (abort or failure), after its own cleanup, tells when it let go of the last
        request it held, reports its unacknowledged transfers in :meth:`stats`, and lends
        ``ot.empty`` on its scheduler's threads the endpoint's slots. ``bindings`` is the process's
        replica binding table: the stage holds a request's entry while it holds the request."""
        self._outbound.connect(links)
        self._transports = transports
        self._endpoint = endpoint
        self._allocator = None if endpoint is None else endpoint.allocator(self.address)
        self._bindings = bindings

    @property
    def address(self) -> str:
        """Where messages for this stage go: its name, or ``name@r<replica>`` for a replica."""
        return self.name if self.replica is None else replica_name(self.name, self.replica)

    @property
    def reports_takes(self) -> bool:
        """Whether the scheduler's inbox tells when a message was taken (an :class:`Inbox`)."""
        return isinstance(self.scheduler.inbox, Inbox)

    # ------------------------------------------------------------------ lifecycle

    @property
    def stopped(self) -> trio.Event:
        """Set when :meth:`run` has returned."""
        return self._lifecycle.stopped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the scheduler thread, report ready, serve until :meth:`stop`, then drain
        (see :class:`~omni_trio.stage.lifecycle.StageLifecycle`)."""
        await self._lifecycle.run(self._allocator, task_status=task_status)

    def stop(self) -> None:
        """Ask the stage to stop: the scheduler stops, published output is still routed."""
        self._lifecycle.stop()

    # ------------------------------------------------------------------ inputs

    async def on_submit(self, payload: StagePayload, bindings: dict[str, int] | None = None) -> None:
        """A new request from the coordinator (this is the entry stage); ``bindings``: its replica binding."""
        request_id = payload.request_id
        if request_id in self.aborted:
            await self._coordinator.complete(
                request_id,
                self.name,
                error=f"Request {request_id} (retired after abort or failure, use a fresh request ID) already exists",
            )
            return
        self._mark_active(request_id, payload_arrived=True, bindings=bindings)
        await self.execute(payload)

    async def deliver_payload(
        self, request_id: str, from_stage: str, payload: StagePayload, bindings: dict[str, int] | None = None
    ) -> None:
        """An upstream stage's payload for ``request_id`` arrived (with the request's replica binding,
        when it came from another process)."""
        if request_id in self.aborted:
            return
        self._mark_active(request_id, payload_arrived=True, bindings=bindings)
        try:
            merged = self._input.receive(request_id, from_stage, payload)
        except Exception as exc:  # noqa: BLE001 - user hooks (merge_fn, wait_for_fn) fail only this request
            await self.send_failure(request_id, f"fan-in of {from_stage!r}: {describe_error(exc)}")
            return
        if merged is not None:
            await self.execute(merged)

    async def deliver_stream_chunks(
        self,
        request_id: str,
        from_stage: str,
        items: list[StreamItem],
        on_taken: Callable[[], object] | None = None,
        bindings: dict[str, int] | None = None,
    ) -> bool:
        """Upstream stream chunks for ``request_id`` arrived (in order).

        With ``on_taken`` and an :class:`Inbox`, the last chunk is queued so that
        ``on_taken`` runs once the scheduler has taken it (or an abort purged it):
        the result is True then, and False when ``on_taken`` will never run
        (the chunks were dropped, or the inbox cannot tell).
        """
        if request_id in self.aborted:
            return False
        if not await self._open_stream(request_id, from_stage, "stream chunk", bindings):
            return False
        inbox = self.scheduler.inbox
        messages = [IncomingMessage(request_id, "stream_chunk", item) for item in items]
        if isinstance(inbox, Inbox):
            inbox.put_all(messages, on_taken)
            return on_taken is not None and bool(messages)
        for message in messages:
            inbox.put(message)
        return False

    async def deliver_stream_signal(
        self, request_id: str, from_stage: str, error: str | None = None, bindings: dict[str, int] | None = None
    ) -> None:
        """An upstream stream ended (or failed with ``error``)."""
        if request_id in self.aborted:
            return
        if error is not None:
            await self.send_failure(request_id, f"stream from {from_stage!r} failed: {error}")
            return
        if not await self._open_stream(request_id, from_stage, "stream_done", bindings):
            return
        # The source travels as data so a scheduler fed by several streams can tell them apart.
        self.scheduler.inbox.put(IncomingMessage(request_id, "stream_done", from_stage))

    def on_abort(self, request_id: str) -> None:
        """Drop everything about ``request_id`` here (an abort)."""
        self.abort_requests((request_id,))

    def abort_requests(self, request_ids: Collection[str]) -> None:
        """Drop everything about each of ``request_ids`` here (an abort; the inbox is swept once)."""
        self._retire(request_ids)
        for request_id in request_ids:
            self.clear_request_state(request_id)
            self.let_go(request_id)

    async def execute(self, payload: StagePayload) -> None:
        """Hand a payload to the scheduler as a ``new_request``."""
        request_id = payload.request_id
        if request_id in self.aborted:
            return
        if self._lifecycle.unhealthy is not None:
            await self.send_failure(request_id, f"stage is unhealthy: {self._lifecycle.unhealthy}")
            return
        try:
            operation = session_operation(payload)
        except ValueError as exc:
            await self.send_failure(request_id, f"session operation: {describe_error(exc)}")
            return
        if operation is not None and not await self._sessions.admit(request_id, payload, operation):
            return
        if self._tracer.enabled:
            self._tracer.event("stage_dispatch", request_id=request_id, stage=self.name)
        try:
            self._enqueue(IncomingMessage(request_id, "new_request", payload))
        except Exception as exc:  # noqa: BLE001 - a scheduler refusing one request fails only it
            await self.send_failure(request_id, f"scheduler refused the request: {describe_error(exc)}",
                                    refused=isinstance(exc, QueueFullError))

    def _enqueue(self, message: IncomingMessage) -> None:
        if self._scheduler_enqueues:
            self.scheduler.enqueue(message)
        else:
            self.scheduler.inbox.put(message)

    def _mark_active(self, request_id: str, *, payload_arrived: bool, bindings: dict[str, int] | None = None) -> None:
        self.hold(request_id, bindings)
        if payload_arrived and self.stream_receiver:
            self._stream_open.add(request_id)

    async def _open_stream(
        self, request_id: str, from_stage: str, what: str, bindings: dict[str, int] | None = None
    ) -> bool:
        if not self.stream_receiver:
            await self.send_failure(
                request_id,
                f"{what} from {from_stage!r} reached a stage that no stage lists in stream_to",
            )
            return False
        if request_id not in self._stream_open:
            if not self.config.can_accept_stream_before_payload:
                await self.send_failure(
                    request_id,
                    f"{what} from {from_stage!r} arrived before the request payload, but this stage is "
                    "not configured to accept pre-payload stream data (can_accept_stream_before_payload)",
                )
                return False
            self._stream_open.add(request_id)
        self.hold(request_id, bindings)
        return True

    def holds(self, request_id: str) -> bool:
        """Whether the stage holds ``request_id`` (it arrived, and is neither finished nor dropped)."""
        return request_id in self.active

    def has_retired(self, request_id: str) -> bool:
        """Whether the stage dropped ``request_id`` (aborted or failed; remembered for a while)."""
        return request_id in self.aborted

    def hold(self, request_id: str, bindings: dict[str, int] | None = None) -> None:
        """The stage holds ``request_id`` (and with it the request's replica binding in this process)."""
        self.active.add(request_id)
        if self._bindings is not None:
            self._bindings.hold(request_id, self.name, bindings)

    def let_go(self, request_id: str) -> None:
        """The request left this stage (unless it came straight back): its binding may go."""
        if self._bindings is not None and request_id not in self.active:
            self._bindings.release(request_id, self.name)

    # ------------------------------------------------------------------ state

    def _retire(self, request_ids: Collection[str]) -> None:
        """Remember each of ``request_ids`` as finished-with-failure and tell the scheduler, once."""
        fresh = [request_id for request_id in dict.fromkeys(request_ids) if request_id not in self.aborted]
        for request_id in fresh:
            self.aborted.add(request_id)
            self._scopes.cancel(request_id)
        if fresh:
            # Before the scheduler's abort hook: a scheduler may queue its own abort note.
            # The scheduler skips aborted ids anyway; purged, it never even sees them.
            purge_inbox(self.scheduler.inbox, fresh)
            if isinstance(self.scheduler.outbox, Outbox):
                # Unsent chunks go now, and a producer blocked putting one for them is let go.
                self.scheduler.outbox.discard_streams(*fresh)
        for request_id in fresh:
            try:
                self.scheduler.abort(request_id)
            except Exception as exc:  # noqa: BLE001 - a faulty abort hook must not stop abort handling
                log.warning(
                    "scheduler_abort_failed", stage=self.name, request_id=request_id, error=describe_error(exc)
                )
            self._abandoned.dropped(request_id, self._lifecycle.nursery)
            if self._endpoint is not None:
                self._endpoint.return_held_credits(self.address, request_id)

    def clear_request_state(self, request_id: str) -> None:
        """Forget a request's per-stage state (after routing, failure or abort)."""
        if request_id in self.active:
            self.active.discard(request_id)
            if not self.active and self._endpoint is not None:
                self._endpoint.stage_idle()
        self._input.cancel(request_id)
        self._stream_open.discard(request_id)
        self._outbound.forget(request_id)

    async def send_failure(self, request_id: str, error: str, *, refused: bool = False) -> None:
        """Fail ``request_id`` here: report it to the coordinator and drop its state (``refused``: the
        stage had no room for it, which the caller gets as ``RequestQueueFull``)."""
        self._retire((request_id,))
        self.clear_request_state(request_id)
        self.let_go(request_id)
        if self._tracer.enabled:
            self._tracer.event("stage_failed", request_id=request_id, stage=self.name, error=error)
        try:
            await self._coordinator.complete(request_id, self.name, error=error, refused=refused)
        except Exception as exc:  # noqa: BLE001 - the coordinator may be gone at shutdown
            log.warning("failure_report_failed", stage=self.name, request_id=request_id, error=describe_error(exc))

    def stats(self) -> StageStats:
        """This stage's counters."""
        stuck = self._abandoned.stuck(self.aborted)
        return StageStats(
            active_requests=len(self.active),
            pending_fan_in=self._input.pending_count(),
            request_scopes=len(self._scopes),
            in_flight_sends=self._outbound.in_flight,
            relay_buffers=0 if self._endpoint is None else self._endpoint.relay_in_use(self.address),
            queued_inbox=queued_work(self.scheduler.inbox),
            healthy=self._lifecycle.unhealthy is None and not stuck,
            busy_seconds=0.0 if self._busy is None else self._busy.seconds,
            sent_bytes={} if self._transports is None else self._transports.sent_bytes(),
            stuck=stuck,
        )
