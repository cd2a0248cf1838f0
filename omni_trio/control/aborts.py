"""Abort delivery to worker processes: ordered, lossless, confirmed, resent until confirmed.

An abort travels to each worker process as an :class:`~omni_trio.control.wire.messages.Abort` on the same
point-to-point socket as every other control message for that process. That path never drops: a PUSH
socket waits at its high-water mark instead (a process that is busy, even holding the GIL for
seconds, finds its aborts queued when it runs again), and it is ordered behind the Submit the caller
sent the process before.

Aborts wait in one lane per process; the lane's single task sends everything that queued up while it
was sending as one message (a storm of 10,000 aborts becomes a few dozen messages, so the delivery
keeps pace with the storm). Each message carries a token that the worker confirms with
:class:`~omni_trio.control.wire.messages.AbortDone` once every stage of the process dropped its requests.
A message not confirmed within :data:`RESEND_S` is sent again, the interval doubling up to
:data:`RESEND_MAX_S`, until it is confirmed or the process is known gone (:meth:`AbortDelivery.forget`:
it died, or it is being restarted). A lane with nothing queued and nothing unconfirmed sleeps on an
event: idle, it costs nothing.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import attrs
import trio

from omni_trio.control.wire import messages as m
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: Most request ids one Abort message carries.
MAX_BATCH = 512
#: How long a sent Abort waits for its confirmation before it is sent again; the wait then doubles.
RESEND_S = 1.0
RESEND_MAX_S = 8.0


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
    """The abort of one request: ``done`` once every process it went to confirmed it (or is gone)."""

    request_id: str


@attrs.define(eq=False)
class _Sent:
    """One Abort message waiting for its confirmation."""

    message: m.Abort
    deliveries: list[Delivery]
    due: float
    interval: float = RESEND_S


@attrs.define(eq=False)
class _Lane:
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

    ``send(process, message)`` sends one control message to a process (waiting, never dropping, when
    its socket is full); ``spawn(fn, *args)`` runs a task for as long as the control plane serves.
    """

    def __init__(
        self,
        send: Callable[[str, m.ControlMessage], Awaitable[None]],
        spawn: Callable[..., Any],
    ) -> None:
        self._send = send
        self._spawn = spawn
        self._lanes: dict[str, _Lane] = {}
        self._tokens = itertools.count()

    def deliver(self, request_id: str, processes: Collection[str]) -> Delivery:
        """Queue the abort of ``request_id`` to each of ``processes``; its ``done`` fires once all confirmed."""
        delivery = Delivery(set(processes), request_id)
        if not delivery.waiting:
            delivery.done.set()
        for process in processes:
            lane = self._lanes.get(process)
            if lane is None:
                lane = self._lanes[process] = _Lane(process)
                self._spawn(self._run, lane)
            lane.queued.append(delivery)
            lane.wake.set()
        return delivery

    def on_done(self, message: m.AbortDone) -> None:
        """A worker confirmed the Abort ``message.token``."""
        lane = self._lanes.get(message.process)
        sent = None if lane is None else lane.sent.pop(message.token, None)
        if sent is not None:
            for delivery in sent.deliveries:
                delivery.arrived(message.process)

    def forget(self, process: str) -> None:
        """``process`` is gone (dead, or being restarted): nothing waits for it any more."""
        lane = self._lanes.pop(process, None)
        if lane is None:
            return
        lane.scope.cancel()
        for delivery in [*lane.queued, *(d for sent in lane.sent.values() for d in sent.deliveries)]:
            delivery.arrived(process)
        lane.queued.clear()
        lane.sent.clear()

    async def _run(self, lane: _Lane) -> None:
        with lane.scope:
            try:
                await self._serve(lane)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return  # the control plane is closing: nothing is delivered any more

    async def _serve(self, lane: _Lane) -> None:
        while True:
            with trio.move_on_at(lane.next_due()):
                await lane.wake.wait()
            lane.wake = trio.Event()
            await self._resend_overdue(lane)
            while lane.queued:
                batch, lane.queued[:MAX_BATCH] = lane.queued[:MAX_BATCH], []
                token = next(self._tokens)
                message = m.Abort(request_ids=[d.request_id for d in batch], token=token)
                # Registered before sending: the confirmation may arrive during the send's checkpoint.
                lane.sent[token] = _Sent(message, batch, trio.current_time() + RESEND_S)
                await self._send(lane.process, message)

    async def _resend_overdue(self, lane: _Lane) -> None:
        now = trio.current_time()
        for token, sent in list(lane.sent.items()):
            if sent.due > now or token not in lane.sent:
                continue
            sent.interval = min(sent.interval * 2, RESEND_MAX_S)
            sent.due = now + sent.interval
            log.info(
                "abort_resent", process=lane.process, token=token, requests=len(sent.deliveries), next_s=sent.interval
            )
            await self._send(lane.process, sent.message)
