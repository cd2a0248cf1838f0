"""How a :class:`~omni_trio.scheduling.simple.SimpleScheduler` takes work from its inbox.

Serial mode takes one message at a time and may gather a batch behind it
(:class:`BatchCollector`); concurrent mode runs N threads that
each take straight from the inbox (:class:`WorkerThreads`). Neither computes: the
scheduler hands each what to do with a message it took.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

from omni_trio.scheduling._support import WAKEUP, BatchingOptions, BatchWindow, ThreadLoop
from omni_trio.scheduling.protocol import IncomingMessage

logger = logging.getLogger(__name__)

#: Whether a taken ``new_request`` must not be computed (its request was aborted).
SkipCheck = Callable[[IncomingMessage], bool]
#: What to do with a message a worker thread took, on that thread's event loop.
TakenHandler = Callable[[IncomingMessage, ThreadLoop], None]


class MessageSource(Protocol):
    """Where a scheduler's messages wait (a :class:`~omni_trio.scheduling.simple.SimpleScheduler`).

    Read on each take: a subclass may give the scheduler another inbox after it was built.
    """

    inbox: queue.Queue[IncomingMessage]
    #: Messages taken from the inbox but not handled yet; served before the inbox.
    pending_messages: collections.deque[IncomingMessage]


class BatchCollector:
    """Gathers the batch a request opens, from ``source``'s set-aside messages first and then its
    inbox, under the batching ``options`` of its scheduler."""

    def __init__(self, options: BatchingOptions, source: MessageSource) -> None:
        self._options = options
        self._source = source

    def next_message(self) -> IncomingMessage:
        """The next message to handle: a set-aside one first, else the inbox's (blocking)."""
        if self._source.pending_messages:
            return self._source.pending_messages.popleft()
        return self._source.inbox.get()

    def collect(
        self,
        first: IncomingMessage,
        *,
        skip: SkipCheck,
        cost_failed: Callable[[str, BaseException], None],
    ) -> list[IncomingMessage]:
        """Gather the batch that ``first`` opens (see ``SimpleScheduler.collect_batch``).

        A joining request that ``skip`` rejects is dropped; one whose cost cannot
        be computed goes to ``cost_failed(request_id, error)`` instead of the batch.
        """
        options = self._options
        batch = [first]
        if options.batch_compute_fn is None or options.max_batch_size <= 1:
            return batch
        cost = options.message_cost(first) if options.max_batch_cost is not None else 0
        window = BatchWindow(options.max_batch_wait_s, armed_at_first=options.batch_wait_when_idle)
        while len(batch) < options.max_batch_size:
            msg = window.next_message(self._inbox_nowait, self._source.inbox)
            if msg is None:
                break
            if msg.type != "new_request":
                self._source.pending_messages.append(msg)
                if msg.type == "wakeup":
                    # Stopping: run what we have instead of sitting out the window.
                    break
                continue
            if skip(msg):
                continue
            if options.max_batch_cost is not None:
                try:
                    msg_cost = options.message_cost(msg)
                except Exception as exc:
                    logger.exception("request_cost_fn failed for %s", msg.request_id)
                    cost_failed(msg.request_id, exc)
                    continue
                if cost + msg_cost > options.max_batch_cost:
                    self._source.pending_messages.appendleft(msg)
                    break
                cost += msg_cost
            batch.append(msg)
            window.joined()
        return batch

    def _inbox_nowait(self) -> IncomingMessage | None:
        try:
            return self._source.inbox.get_nowait()
        except queue.Empty:
            return None


class WorkerThreads:
    """``count`` threads that take straight from ``source``'s inbox until ``stopping`` is set.

    No bridge queue sits between the inbox and the workers, so nothing taken can
    be stranded at stop: a message once taken is always handled, even if the stop
    came meanwhile.
    """

    def __init__(self, count: int, source: MessageSource, stopping: threading.Event) -> None:
        self._count = count
        self._source = source
        self._stopping = stopping
        self._lock = threading.Lock()
        self._live = 0

    def serve(self, handle: TakenHandler) -> None:
        """Run the workers, each calling ``handle`` on every message it takes; return when all stopped."""
        with self._lock:
            self._live = self._count
        base = threading.current_thread().name
        workers = [
            # Each worker runs in a copy of this thread's context: ot.empty finds the stage's pool there.
            threading.Thread(
                target=contextvars.copy_context().run,
                args=(self._work, handle),
                name=f"{base}-worker-{i}",
                daemon=True,
            )
            for i in range(self._count)
        ]
        for worker in workers:
            worker.start()
        # The workers must not outlive serve() (the scheduler's start()).
        for worker in workers:
            worker.join()

    def _work(self, handle: TakenHandler) -> None:
        loop = ThreadLoop()
        try:
            while not self._stopping.is_set():
                handle(self._source.inbox.get(), loop)
        finally:
            loop.close()
            with self._lock:
                self._live -= 1
                others_alive = self._live > 0
            if others_alive:
                # stop() put one sentinel; pass one on so each blocked sibling wakes.
                self._source.inbox.put(WAKEUP)
