"""The bytes queued for streaming callers and not read yet, and which streams to fail when they are too many.

A streaming caller's events wait in its request's channel until its reader takes them; a reader that
stops reading (or reads slower than the stream comes) would let the stream pile up in the caller's
memory. Every queued event adds its bytes to its request's backlog and to a total, the
reader's take subtracts them, and once the total is over ``stream_delivery.max_total_backlog_bytes``
whole streams are failed, those whose readers have been idle longest first, until it fits: their
queued events are dropped and they get a :class:`~omni_trio.errors.RequestQueueFull` instead.

The bytes of an event (:func:`event_bytes`) are those of its chunk or result: a tensor's or an array's
``nbytes``, the length of ``bytes``, and for a dict (or a ``StagePayload``'s ``data`` dict) the sum of
its values' (one level down, as the reference sums the ``bytes`` values of a dict chunk). "Idle
longest" is by the order of the readers' last takes (a stream's admission counts as its reader's first),
counted, not timed: a reader that took an event more recently is the more active one.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from omni_trio.coordinator.live_request import LiveRequest
from omni_trio.errors import QUEUE_FULL_TEXT, RequestQueueFull
from omni_trio.payload import StagePayload
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

__all__ = ["StreamBacklog", "event_bytes"]


def event_bytes(value: Any) -> int:
    """The bytes a queued chunk or result counts for (see the module docstring)."""
    if isinstance(value, StagePayload):
        value = value.data
    if type(value) is dict:
        return sum(_leaf_bytes(item) for item in value.values())
    return _leaf_bytes(value)


def _leaf_bytes(value: Any) -> int:
    nbytes = getattr(value, "nbytes", None)  # a tensor, an array, a memoryview
    if type(nbytes) is int:
        return nbytes
    return len(value) if isinstance(value, (bytes, bytearray)) else 0


class StreamBacklog:
    """The backlog of every streaming request with events queued (see the module docstring).

    The coordinator calls :meth:`queued` for each event it puts into a request's channel, the
    request's reader :meth:`taken` for each event it takes, and :meth:`dropped` when nobody will
    read what is left (the reader closed, or the stream is being failed).
    """

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        #: Bytes queued and not read, over every stream.
        self.total = 0
        self._takes = 0  # counts takes: a request's last_take orders the readers by idleness
        self._holding: set[LiveRequest] = set()  # the requests whose backlog is above 0

    def started(self, live: LiveRequest) -> None:
        """``live`` was admitted as a stream: its reader counts as active from now (as if it had just taken
        an event: of two readers that never read, the older stream's is the idler)."""
        self._takes += 1
        live.last_take = self._takes

    def queued(self, live: LiveRequest, nbytes: int) -> bool:
        """An event of ``nbytes`` went into ``live``'s channel (events of 0 bytes count too: the reader
        takes every event, in order); whether the total is now over the limit."""
        live.backlog_sizes.append(nbytes)
        if not nbytes:
            return False
        live.backlog_bytes += nbytes
        self.total += nbytes
        self._holding.add(live)
        return self.total > self.limit_bytes

    def taken(self, live: LiveRequest) -> None:
        """``live``'s reader took its oldest queued event."""
        self._takes += 1
        live.last_take = self._takes
        sizes = live.backlog_sizes
        if sizes and (nbytes := sizes.popleft()):
            self._forget(live, nbytes)

    def dropped(self, live: LiveRequest) -> None:
        """Nothing of ``live``'s queued events will be read: none counts any more."""
        self._forget(live, live.backlog_bytes)
        live.backlog_sizes.clear()

    def to_fail(self) -> list[LiveRequest]:
        """The streams to fail so that the total fits: idle longest first, only streams holding bytes."""
        excess = self.total - self.limit_bytes
        chosen: list[LiveRequest] = []
        for live in sorted(self._holding, key=lambda held: held.last_take):
            if excess <= 0:
                break
            chosen.append(live)
            excess -= live.backlog_bytes
        return chosen

    def fail(self, live: LiveRequest) -> RequestQueueFull:
        """Drop ``live``'s queued events (one of :meth:`to_fail`'s) and say why, as the error its reader gets."""
        unread = live.backlog_bytes
        with contextlib.suppress(trio.WouldBlock):
            while True:
                live.received.receive_nowait()
        self.dropped(live)
        log.warning("stream_backlog_exceeded", request_id=live.request_id, unread_bytes=unread,
                    limit_bytes=self.limit_bytes)
        return RequestQueueFull(
            live.request_id,
            "coordinator",
            f"{QUEUE_FULL_TEXT} Its stream's unread events ({unread} bytes) were dropped: the streams waiting "
            f"for their readers held more than stream_delivery.max_total_backlog_bytes "
            f"({self.limit_bytes}), and its reader had been idle longest",
        )

    def _forget(self, live: LiveRequest, nbytes: int) -> None:
        if not nbytes:
            return
        live.backlog_bytes -= nbytes
        self.total -= nbytes
        if not live.backlog_bytes:
            self._holding.discard(live)
