"""The seam between a stage's trio tasks and its scheduler's thread.

The scheduler blocks on ``queue.Queue`` objects in its own thread; trio must
never block. Two crossings, neither of which polls:

* :class:`SchedulerThread` runs ``warm_up_serving_thread()`` then ``start()``
  and reports "warm" and "finished" to trio through the ``TrioToken``; on it,
  ``ot.empty`` allocates from the stage's shared-memory pool.
* The stage's drain takes the outbox in batches of up to 64 messages from
  an :func:`outbox_source`, except that the first message after the outbox
  was empty comes alone: it is sent at once (the first chunk of a stream
  does not wait for its run to be encoded), and what the scheduler puts
  while it is in flight coalesces into the next batch. After each batch the
  drain says it was sent (``sent()``): a scheduler thread whose put of a
  stream's first chunk woke the drain waits for that, so that it does not
  keep the GIL from the drain meanwhile (see ``Outbox``). For an
  :class:`~omni_trio.scheduling.Outbox`
  (every built-in scheduler's) an :class:`OutboxWaiter`, which takes what is
  queued and otherwise arms the outbox to wake it on the next ``put`` (from a
  scheduler thread by ringing a :class:`Doorbell`, an eventfd the drain
  awaits: one write, and trio's epoll reschedules the drain directly); for
  any other ``queue.Queue`` an :class:`OutboxPump`, a thread that blocks on
  ``outbox.get()`` and hands batches to a trio memory channel (one more
  thread hand-off per batch). A semaphore bounds the pump's batches in
  flight, so a slow drain throttles it instead of copying the outbox into
  trio's memory. The pump stops at the ``wakeup`` sentinel, which the stage
  puts into the outbox when it stops.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import queue
import threading
import weakref
from typing import Any, Protocol

import trio

from omni_trio.comm.alloc import SlotAllocator, allocating
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import OutgoingMessage

#: Messages handled back to back before the drain yields.
DRAIN_BATCH = 64
_BATCHES_IN_FLIGHT = 4


def _post(token: trio.lowlevel.TrioToken, fn: Any, *args: Any) -> bool:
    """Run ``fn(*args)`` on trio's thread soon; False if the trio run is gone."""
    try:
        token.run_sync_soon(fn, *args)
    except trio.RunFinishedError:
        return False
    return True


class SchedulerThread:
    """Runs one scheduler's serve loop on a dedicated daemon thread."""

    def __init__(self, stage_name: str, scheduler: Any, allocator: SlotAllocator | None = None) -> None:
        self.scheduler = scheduler
        self._allocator = allocator
        self.warm = trio.Event()
        self.finished = trio.Event()
        self.warm_up_error: BaseException | None = None
        self.crash: BaseException | None = None
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._body, name=f"scheduler-{stage_name}", daemon=True)

    def start(self) -> None:
        """Start the thread; await :attr:`warm` to know warm-up finished."""
        self._thread.start()

    def _body(self) -> None:
        # ot.empty on this thread (and the threads its scheduler starts) uses the stage's pool.
        with allocating(self._allocator):
            self._serve()

    def _serve(self) -> None:
        warm_up = getattr(self.scheduler, "warm_up_serving_thread", None)
        try:
            if warm_up is not None:
                warm_up()
        except BaseException as exc:  # noqa: BLE001 - reported to the stage, which fails start-up
            self.warm_up_error = exc
            _post(self._token, self.warm.set)
            _post(self._token, self.finished.set)
            return
        _post(self._token, self.warm.set)
        try:
            self.scheduler.start()
        except BaseException as exc:  # noqa: BLE001 - the stage fails the scheduler's requests
            self.crash = exc
        finally:
            _post(self._token, self.finished.set)

    def is_alive(self) -> bool:
        """Whether the scheduler thread is still running."""
        return self._thread.is_alive()


class OutboxSource(Protocol):
    """Where the stage's drain takes its scheduler's messages from, a batch at a time."""

    def start(self) -> None:
        """Begin delivering."""

    async def next_batch(self) -> list[OutgoingMessage]:
        """The next 1..64 messages, in outbox order; waits (without polling) while there are none."""
        ...

    def sent(self) -> None:
        """The batch :meth:`next_batch` returned last has been sent."""

    def close(self) -> None:
        """Nobody drains any more: release whatever waits on the source."""


def outbox_source(stage_name: str, outbox: queue.Queue[OutgoingMessage]) -> OutboxSource:
    """The cheapest way to drain ``outbox``: wake-on-put for an :class:`Outbox`, else a pump thread."""
    if isinstance(outbox, Outbox):
        return OutboxWaiter(outbox)
    return OutboxPump(stage_name, outbox)


class Doorbell:
    """An eventfd that any thread rings and the stage's drain awaits on its trio loop.

    A ring is one ``write`` that wakes the loop's epoll, which reschedules the
    waiting drain task itself: no ``run_sync_soon``, so no trio entry-queue
    task (and its extra scheduler tick) between the put and the drain.
    """

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # Also closed when the waiter is dropped without close() (a test): nothing can ring it by then.
        self._finalizer = weakref.finalize(self, os.close, self._fd)

    def ring(self) -> None:
        """Wake the waiter (any thread; never blocks: the counter cannot overflow at one per put)."""
        os.eventfd_write(self._fd, 1)

    async def wait(self) -> None:
        """Until rung since the last wait (at once if it was)."""
        await trio.lowlevel.wait_readable(self._fd)
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._fd)

    def close(self) -> None:
        """Release the fd (on the loop; nothing may ring it any more)."""
        if self._finalizer.alive:
            trio.lowlevel.notify_closing(self._fd)
            self._finalizer()


class OutboxWaiter:
    """Drains an :class:`Outbox` on trio's thread; the outbox's ``put`` wakes it.

    How it waits follows who put last: after a put from another thread (a
    scheduler thread) the drain waits on its :class:`Doorbell`, which the
    next put rings; after a put on the loop itself (inline or ``async def``
    compute) on a ``trio.Event``, which the next put sets (no syscall). A put
    of the other kind still wakes it (``run_sync_soon`` sets the event, a ring
    is a ring from any thread), only a little slower.
    """

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._bell = Doorbell()
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._thread_puts = True  # who put last: another thread (the default schedulers' case) or the loop
        outbox.attach(self._trio_thread)  # puts on the loop (inline compute) never wait for the stream bound

    def start(self) -> None:
        """Nothing to start: no thread is needed."""

    async def next_batch(self) -> list[OutgoingMessage]:
        """Take what is queued, else sleep until the next put and take only the first message then."""
        limit = DRAIN_BATCH
        while True:
            arrived = None if self._thread_puts else trio.Event()
            batch = self._outbox.take_or_arm(limit, functools.partial(self._wake, arrived))
            if batch:
                return batch
            try:
                if arrived is None:
                    await self._bell.wait()
                else:
                    await arrived.wait()
            except BaseException:
                self._outbox.disarm()
                raise
            # Nothing is in flight: what woke us goes out alone, at once, even if a producer thread that
            # kept the GIL queued more meanwhile; those coalesce into the next batch while it is sent.
            limit = 1

    def sent(self) -> None:
        """Let a scheduler thread waiting for its stream's first chunk to leave go on (see ``Outbox``)."""
        self._outbox.batch_sent()

    def _wake(self, arrived: trio.Event | None) -> None:
        # Runs on the putting thread, inside the outbox's lock: never block here.
        on_loop = threading.get_ident() == self._trio_thread
        self._thread_puts = not on_loop
        if arrived is None:
            self._bell.ring()
        elif on_loop:
            arrived.set()
        else:
            _post(self._token, arrived.set)

    def close(self) -> None:
        """Disarm the outbox, let every put through (nobody drains any more) and release the bell."""
        self._outbox.disarm()
        self._outbox.stop_blocking()
        self._bell.close()


class OutboxPump:
    """Moves a plain ``queue.Queue`` outbox into trio, a batch per wake-up, through a thread."""

    def __init__(self, stage_name: str, outbox: queue.Queue[OutgoingMessage]) -> None:
        self._outbox = outbox
        self._token = trio.lowlevel.current_trio_token()
        self._send, self._batches = trio.open_memory_channel[list[OutgoingMessage]](math.inf)
        self._permits = threading.Semaphore(_BATCHES_IN_FLIGHT)
        self._closed = False
        self._thread = threading.Thread(target=self._body, name=f"outbox-{stage_name}", daemon=True)

    def start(self) -> None:
        """Start pumping."""
        self._thread.start()

    async def next_batch(self) -> list[OutgoingMessage]:
        """The next batch the pump took; frees its slot for the pump."""
        batch = await self._batches.receive()
        self._permits.release()
        return batch

    def sent(self) -> None:
        """Nothing waits for a send: a plain queue's put returns at once."""

    def close(self) -> None:
        """Nobody drains any more: let the pump thread finish instead of waiting for a slot."""
        self._closed = True
        self._send.close()
        self._permits.release(_BATCHES_IN_FLIGHT)

    def _body(self) -> None:
        while True:
            try:
                first, limit = self._outbox.get_nowait(), DRAIN_BATCH
            except queue.Empty:
                # The drain is idle: the message it waited for goes alone (see OutboxWaiter.next_batch).
                first, limit = self._outbox.get(), 1
            batch = [first]
            while first.type != "wakeup" and len(batch) < limit:
                try:
                    message = self._outbox.get_nowait()
                except queue.Empty:
                    break
                batch.append(message)
                if message.type == "wakeup":
                    break
            self._permits.acquire()
            if self._closed or not _post(self._token, self._deliver, batch) or batch[-1].type == "wakeup":
                return

    def _deliver(self, batch: list[OutgoingMessage]) -> None:
        try:
            self._send.send_nowait(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._permits.release()
