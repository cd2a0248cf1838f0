"""The seam between a stage's trio tasks and its scheduler's thread.

The scheduler blocks on ``queue.Queue`` objects in its own thread; trio must
never block. Two crossings, neither of which polls:

* :class:`SchedulerThread` runs ``warm_up_serving_thread()`` then ``start()``
  and reports "warm" and "finished" to trio through the ``TrioToken``.
* :class:`OutboxPump` is a thread that blocks on ``outbox.get()`` and hands
  what it took, up to 64 messages at a time, to a trio memory channel.
  A semaphore bounds the batches in flight, so a slow drain throttles the
  pump instead of copying the outbox into trio's memory. It stops at the
  ``wakeup`` sentinel, which the stage puts into the outbox when it stops.
"""

from __future__ import annotations

import math
import queue
import threading
from typing import Any

import trio

from omni_trio.scheduling.protocol import OutgoingMessage

#: Messages handled back to back before the drain yields (SPEC §3.4).
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

    def __init__(self, stage_name: str, scheduler: Any) -> None:
        self.scheduler = scheduler
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


class OutboxPump:
    """Moves a scheduler's outbox into trio, a batch per wake-up."""

    def __init__(self, stage_name: str, outbox: queue.Queue[OutgoingMessage]) -> None:
        self._outbox = outbox
        self._token = trio.lowlevel.current_trio_token()
        self._send, self.batches = trio.open_memory_channel[list[OutgoingMessage]](math.inf)
        self._permits = threading.Semaphore(_BATCHES_IN_FLIGHT)
        self._closed = False
        self._thread = threading.Thread(target=self._body, name=f"outbox-{stage_name}", daemon=True)

    def start(self) -> None:
        """Start pumping."""
        self._thread.start()

    def batch_taken(self) -> None:
        """Called by the drain for every batch it received: frees a slot for the pump."""
        self._permits.release()

    def close(self) -> None:
        """Nobody drains any more: let the pump thread finish instead of waiting for a slot."""
        self._closed = True
        self._send.close()
        self._permits.release(_BATCHES_IN_FLIGHT)

    def _body(self) -> None:
        while True:
            first = self._outbox.get()
            batch = [first]
            while first.type != "wakeup" and len(batch) < DRAIN_BATCH:
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
