"""An outbox that wakes its stage itself, and can bound the stream it holds.

The stage must learn, without polling, that its scheduler published a
message. With a plain ``queue.Queue`` outbox it needs a thread that blocks
on ``get()`` and forwards to trio: two thread hand-offs per message. An
:class:`Outbox` instead calls the stage back from ``put`` (on whichever
thread puts), so a message costs one hand-off from a scheduler thread and
none at all when it is put on the stage's own event-loop thread.

Every built-in scheduler uses one; a custom scheduler opts in by making its
``outbox`` an ``Outbox()``. It is a ``queue.Queue`` in every other respect.

``Outbox(max_queued_streams=n)`` also bounds the ``stream`` messages waiting
in it: a scheduler thread that puts one more blocks until the stage's drain
has taken one (the drain takes a stream message only once the previous
ones were sent, so a producer then runs at the pace its consumers allow).
Only ``stream`` messages put from another thread than the stage's event
loop ever wait: results, errors and the runtime's ``wakeup`` sentinel never
do, nor anything put on the loop (inline compute), and once the stage stops
(:meth:`Outbox.stop_blocking`) no put waits any more.

A stream's first chunk is handed over: when a scheduler thread's ``put`` of a
``stream`` message wakes the idle stage, and it is the first time that
request's stream does, the put returns only once the stage's drain has sent
that message (:meth:`Outbox.batch_sent`), or after one GIL switch interval
(``sys.getswitchinterval()``, 5 ms by default) at most. A producer that went
on at once would keep the GIL from the drain that must encode and send the
chunk; the drain would get it back at the next switch interval, or by luck
sooner, while the first chunk waits. The pause comes at most once per
request, so the rest of the stream runs at the producer's pace.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from omni_trio.scheduling.idset import BoundedIdSet
from omni_trio.scheduling.protocol import OutgoingMessage


def _is_stream(item: object) -> bool:
    return getattr(item, "type", None) == "stream"


class _Handover(NamedTuple):
    """A scheduler thread's put that woke the idle drain with a request's first chunk: it waits for the send."""

    thread: int
    request_id: str
    sent: threading.Event


class Outbox(queue.Queue[OutgoingMessage]):
    """A ``queue.Queue`` of :class:`OutgoingMessage` that reports its next ``put``.

    The stage calls :meth:`take_or_arm`: it returns the queued messages, or,
    when there are none, arms a callback that the next ``put`` runs (once,
    on the putting thread, under the queue's lock: it must be quick and must
    not call the outbox). Nothing else changes: ``put``/``get`` behave as a
    ``queue.Queue``'s, ``maxsize`` included.

    ``max_queued_streams`` (None: unbounded) is how many ``stream`` messages
    may wait in the outbox; a ``put`` of one more from a thread other than
    the stage's event loop waits for room, like a full ``queue.Queue``'s put
    (``block=False`` and ``timeout`` raise ``queue.Full`` the same way).
    """

    def __init__(self, maxsize: int = 0, *, max_queued_streams: int | None = None) -> None:
        if max_queued_streams is not None and (
            isinstance(max_queued_streams, bool) or not isinstance(max_queued_streams, int) or max_queued_streams < 1
        ):
            raise ValueError(f"max_queued_streams must be None or a whole number >= 1, got {max_queued_streams!r}")
        super().__init__(maxsize)
        self.max_queued_streams = max_queued_streams
        self._on_put: Callable[[], object] | None = None
        self._streams = 0  # stream messages queued
        self._loop_thread: int | None = None  # the stage's event loop: its puts never wait
        self._blocking = True
        self._retired = BoundedIdSet()  # requests the stage dropped: their stream puts never wait
        self._handed_over = BoundedIdSet()  # requests whose stream woke the drain once: no more pauses
        self._handover: _Handover | None = None

    @property
    def queued_streams(self) -> int:
        """``stream`` messages waiting in the outbox."""
        with self.mutex:
            return self._streams

    def attach(self, loop_thread: int) -> None:
        """The stage draining this outbox runs its event loop on ``loop_thread``: puts made there never wait."""
        with self.mutex:
            self._loop_thread = loop_thread
            self._blocking = True

    def stop_blocking(self) -> None:
        """From now on no ``put`` waits for the stream bound (the stage stops: it may never drain again)."""
        with self.mutex:
            self._blocking = False
            self.not_full.notify_all()
            self._end_handover(None)

    def batch_sent(self) -> None:
        """The drain sent the batch it took last: a put waiting for its first chunk to leave returns."""
        with self.mutex:
            self._end_handover(None)

    def _end_handover(self, request_id: str | None) -> None:
        # With self.mutex held: release the waiting put (only if it is ``request_id``'s, when given).
        handover = self._handover
        if handover is not None and request_id in (None, handover.request_id):
            self._handover = None
            handover.sent.set()

    def put(self, item: OutgoingMessage, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``item``; a ``stream`` message past ``max_queued_streams`` waits for room, and a request's
        first chunk that woke the idle drain waits until it was sent (see the module)."""
        if self.max_queued_streams is None or not _is_stream(item) or threading.get_ident() == self._loop_thread:
            super().put(item, block, timeout)
        else:
            self._put_bounded(item, block, timeout)
        handover = self._handover
        if handover is not None and handover.thread == threading.get_ident():
            handover.sent.wait(sys.getswitchinterval())
            with self.mutex:
                if self._handover is handover:
                    self._handover = None

    def _put_bounded(self, item: OutgoingMessage, block: bool, timeout: float | None) -> None:
        with self.not_full:
            if not block:
                if not self._has_room(item):
                    raise queue.Full
            elif timeout is None:
                while not self._has_room(item):
                    self.not_full.wait()
            elif timeout < 0:
                raise ValueError("'timeout' must be a non-negative number")
            else:
                deadline = time.monotonic() + timeout
                while not self._has_room(item):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise queue.Full
                    self.not_full.wait(remaining)
            if item.request_id in self._retired:
                return  # the stage retired the request (maybe while we waited): the drain would drop it
            self._put(item)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def _has_room(self, item: OutgoingMessage) -> bool:
        # With self.mutex held; the stream bound applies while the stage may still drain.
        assert self.max_queued_streams is not None
        if item.request_id in self._retired:
            return True  # dropped without waiting
        if self.maxsize > 0 and self._qsize() >= self.maxsize:
            return False
        return not self._blocking or self._streams < self.max_queued_streams

    def _put(self, item: OutgoingMessage) -> None:
        # Called by queue.Queue.put with self.mutex held.
        self.queue.append(item)
        if _is_stream(item):
            self._streams += 1
        on_put, self._on_put = self._on_put, None
        if on_put is not None:
            if (
                _is_stream(item)
                and item.request_id not in self._handed_over
                and threading.get_ident() != self._loop_thread
            ):
                self._handed_over.add(item.request_id)
                self._handover = _Handover(threading.get_ident(), item.request_id, threading.Event())
            on_put()

    def _get(self) -> OutgoingMessage:
        # Called by queue.Queue.get with self.mutex held.
        item = self.queue.popleft()
        if _is_stream(item):
            self._streams -= 1
        return item

    def take_or_arm(self, limit: int, on_put: Callable[[], object]) -> list[OutgoingMessage]:
        """Take up to ``limit`` messages; if there are none, arm ``on_put`` for the next put instead."""
        with self.mutex:
            count = min(limit, len(self.queue))
            if not count:
                self._on_put = on_put
                return []
            taken = [self.queue.popleft() for _ in range(count)]
            self._streams -= sum(1 for item in taken if _is_stream(item))
            # Every waiter re-checks its own condition (room for any item, or for a stream message).
            self.not_full.notify_all()
            return taken

    def discard_streams(self, *request_ids: str) -> int:
        """The stage retired ``request_ids``: drop their queued ``stream`` messages (the drain would drop
        them). With a stream bound, a put of one for them, waiting or later, returns at once and drops it
        too. Returns how many were queued.

        One sweep of the queue for all of them, and none when it holds no stream message: an abort
        storm retires thousands of requests while results queue up (a sweep per request was quadratic).
        """
        with self.mutex:
            for request_id in request_ids:
                self._retired.add(request_id)
                self._end_handover(request_id)
            if not self._streams:
                return 0
            dropped = set(request_ids)
            kept = [item for item in self.queue if not (_is_stream(item) and item.request_id in dropped)]
            removed = len(self.queue) - len(kept)
            if removed:
                self.queue.clear()
                self.queue.extend(kept)
                self._streams -= removed
                self.unfinished_tasks = max(self.unfinished_tasks - removed, 0)
                if not self.unfinished_tasks:
                    self.all_tasks_done.notify_all()
                self.not_full.notify_all()
            return removed

    def disarm(self) -> None:
        """Forget an armed callback (its waiter is gone)."""
        with self.mutex:
            self._on_put = None
