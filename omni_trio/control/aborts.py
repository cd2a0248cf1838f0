"""Abort delivery to worker processes: ordered, lossless, confirmed, resent until confirmed.

An abort travels to each worker process as an :class:`~omni_trio.control.wire.messages.Abort` on the same
point-to-point socket as every other control message for that process. That path never drops: a PUSH
socket waits at its high-water mark instead (a process that is busy, even holding the GIL for
seconds, finds its aborts queued when it runs again), and it is ordered behind the Submit the caller
sent the process before.

Aborts wait in one queue per process; the queue's single task sends everything that queued up while
it was sending as one message (a storm of 10,000 aborts becomes a few dozen messages, so the delivery
keeps pace with the storm). Each message carries a token that the worker confirms with
:class:`~omni_trio.control.wire.messages.AbortDone` once every stage of the process dropped its requests.
A message not confirmed within :data:`RESEND_S` is sent again, the interval doubling up to
:data:`RESEND_MAX_S`, until it is confirmed or the process is known gone (:meth:`AbortDelivery.forget`:
it died, or it is being restarted). A queue with nothing queued and nothing unconfirmed sleeps on an
event: idle, it costs nothing.

A caller waits for a delivery (its ``released``) at most :data:`WAIT_BOUND_S` (a worker that stopped
answering does not hold it for good): one task for all deliveries sleeps until the oldest
unconfirmed one's bound, then lets its waiters go (logged) while the delivery goes on.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Collection

import attrs
import trio

from omni_trio.control.endpoint import Endpoint
from omni_trio.control.wire import messages as m
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: Most request ids one Abort message carries.
MAX_BATCH = 512
#: How long a sent Abort waits for its confirmation before it is sent again; the wait then doubles.
RESEND_S = 1.0
RESEND_MAX_S = 8.0
#: How long a delivery's waiters wait for every process's confirmation (delivery goes on after it).
WAIT_BOUND_S = 5.0


@attrs.define(eq=False)
class Awaited:
    """Answers awaited from ``waiting`` processes: ``done`` once each answered (or is gone)."""

    waiting: set[str]
    done: trio.Event = attrs.field(factory=trio.Event, kw_only=True)

    def arrived(self, process: str) -> None:
        """``process`` answered (or is gone)."""
        self.waiting.discard(process)
        if not self.waiting:
            self.done.set()


@attrs.define(eq=False)
class Delivery(Awaited):
    """The abort of one request: ``done`` once every process it went to confirmed it (or is gone);
    ``released`` then too, or once its waiters stop waiting (:data:`WAIT_BOUND_S`)."""

    request_id: str
    released: trio.Event = attrs.field(factory=trio.Event, kw_only=True)

    def arrived(self, process: str) -> None:
        """``process`` confirmed (or is gone)."""
        super().arrived(process)
        if self.done.is_set():
            self.released.set()


@attrs.define(eq=False)
class _Sent:
    """One Abort message waiting for its confirmation."""

    message: m.Abort
    deliveries: list[Delivery]
    due: float
    interval: float = RESEND_S


@attrs.define(eq=False)
class _AbortQueue:
    """The aborts of one process: queued ones, and sent ones waiting for their confirmation."""

    process: str
    queued: list[Delivery] = attrs.field(factory=list)
    sent: dict[int, _Sent] = attrs.field(factory=dict)
    wake: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def next_due(self) -> float:
        return min((sent.due for sent in self.sent.values()), default=math.inf)


class AbortDelivery:
    """Delivers aborts to worker processes (see the module docstring).

    The process's ``endpoint`` sends them (waiting, never dropping, when a socket is full); each
    process's queue is a task of the endpoint.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._queues: dict[str, _AbortQueue] = {}
        self._tokens = itertools.count()
        #: Unconfirmed deliveries in the order they began, each with the time its waiters are let go.
        self._bounds: collections.deque[tuple[float, Delivery]] = collections.deque()
        self._bounded = trio.Event()  # set while _bounds has entries (the bounds task waits on it)
        self._bounds_task = False

    def deliver(self, request_id: str, processes: Collection[str]) -> Delivery:
        """Queue the abort of ``request_id`` to each of ``processes``; its ``done`` fires once all confirmed."""
        delivery = Delivery(set(processes), request_id)
        if not delivery.waiting:
            delivery.done.set()
            delivery.released.set()
        else:
            self._bounds.append((trio.current_time() + WAIT_BOUND_S, delivery))
            self._bounded.set()
            if not self._bounds_task:
                self._bounds_task = True
                self._endpoint.spawn(self._let_go_overdue)
        for process in processes:
            queue = self._queues.get(process)
            if queue is None:
                queue = self._queues[process] = _AbortQueue(process)
                self._endpoint.spawn(self._run, queue)
            queue.queued.append(delivery)
            queue.wake.set()
        return delivery

    def on_done(self, message: m.AbortDone) -> None:
        """A worker confirmed the Abort ``message.token``."""
        queue = self._queues.get(message.process)
        sent = None if queue is None else queue.sent.pop(message.token, None)
        if sent is not None:
            for delivery in sent.deliveries:
                delivery.arrived(message.process)

    def forget(self, process: str) -> None:
        """``process`` is gone (dead, or being restarted): nothing waits for it any more."""
        queue = self._queues.pop(process, None)
        if queue is None:
            return
        queue.scope.cancel()
        for delivery in [*queue.queued, *(d for sent in queue.sent.values() for d in sent.deliveries)]:
            delivery.arrived(process)
        queue.queued.clear()
        queue.sent.clear()

    async def _let_go_overdue(self) -> None:
        """Forever: release each delivery still unconfirmed at its bound (see the module docstring)."""
        while True:
            await self._bounded.wait()
            while self._bounds:
                let_go_at, delivery = self._bounds[0]
                if delivery.released.is_set():
                    self._bounds.popleft()
                    continue
                await trio.sleep_until(let_go_at)
                if not delivery.released.is_set():
                    log.warning(
                        "abort_not_confirmed_yet", request_id=delivery.request_id, processes=sorted(delivery.waiting)
                    )
                    delivery.released.set()
            self._bounded = trio.Event()

    async def _run(self, queue: _AbortQueue) -> None:
        with queue.scope:
            try:
                await self._serve(queue)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return  # the control plane is closing: nothing is delivered any more

    async def _serve(self, queue: _AbortQueue) -> None:
        while True:
            with trio.move_on_at(queue.next_due()):
                await queue.wake.wait()
            queue.wake = trio.Event()
            await self._resend_overdue(queue)
            while queue.queued:
                batch, queue.queued[:MAX_BATCH] = queue.queued[:MAX_BATCH], []
                token = next(self._tokens)
                message = m.Abort(request_ids=[d.request_id for d in batch], token=token)
                # Registered before sending: the confirmation may arrive during the send's checkpoint.
                queue.sent[token] = _Sent(message, batch, trio.current_time() + RESEND_S)
                await self._endpoint.send(queue.process, message)

    async def _resend_overdue(self, queue: _AbortQueue) -> None:
        now = trio.current_time()
        for token, sent in list(queue.sent.items()):
            if sent.due > now or token not in queue.sent:
                continue
            sent.interval = min(sent.interval * 2, RESEND_MAX_S)
            sent.due = now + sent.interval
            log.info(
                "abort_resent", process=queue.process, token=token, requests=len(sent.deliveries), next_s=sent.interval
            )
            await self._endpoint.send(queue.process, sent.message)
