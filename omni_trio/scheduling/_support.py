"""Helpers shared by every scheduler in this package.

Kept in one place so the schedulers do not each grow their own slightly
different copy: the stop sentinel, a thread-safe bounded id set (built on
:class:`omni_trio.scheduling.idset.BoundedIdSet`, which evicts oldest first), the
per-thread event loop that runs ``async`` compute functions, and a guard for
user callbacks whose errors must only be logged.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, Final, TypeVar

from omni_trio.scheduling.errors import QueueFullError
from omni_trio.scheduling.generated import ChunkSink, drive, drive_async
from omni_trio.scheduling.idset import DEFAULT_CAPACITY, BoundedIdSet
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage

logger = logging.getLogger("omni_trio.scheduling")

T = TypeVar("T")

#: The stop sentinel: ``stop()`` puts it into the inbox so a ``start()``
#: blocked on ``inbox.get()`` wakes up and notices it should return.
WAKEUP: Final[IncomingMessage] = IncomingMessage(request_id="", type="wakeup")


def checked_count(name: str, value: int, *, minimum: int = 1) -> int:
    """``value`` if it is a whole number >= ``minimum``; else ValueError naming the option ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def checked_limit(name: str, value: int | None, *, minimum: int = 1) -> int | None:
    """:func:`checked_count` for an optional limit (None: unbounded)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be None or a whole number >= {minimum}, got {value!r}")
    return value


def checked_wait_ms(name: str, value: float) -> float:
    """``value`` if it is a finite number of milliseconds >= 0; else ValueError naming the option ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a number of milliseconds >= 0, got {value!r}")
    return float(value)


def checked_max_pending(max_pending: int | None) -> int | None:
    """Validate a scheduler's ``max_pending`` (None: unbounded; else at least 1, or nothing could wait)."""
    return checked_limit("max_pending", max_pending)


def refuse_if_full(
    max_pending: int | None,
    msg: IncomingMessage,
    inbox: queue.Queue[IncomingMessage],
    taken: Iterable[IncomingMessage] = (),
) -> None:
    """Raise QueueFullError when ``msg`` is a new request and ``max_pending`` requests already wait.

    Waiting means queued in ``inbox`` or taken from it but not started (``taken``,
    a scheduler's ``pending_messages``); counted on each call rather than kept in a
    counter, because the stage also removes an aborted request's messages from the
    inbox itself. Other messages (stream chunks, signals) belong to admitted
    requests and are never refused.
    """
    if max_pending is None or msg.type != "new_request":
        return
    with inbox.mutex:
        waiting = sum(1 for queued in inbox.queue if queued.type == "new_request")
    # tuple() copies the deque in one C call, safe against the scheduler thread's pops.
    waiting += sum(1 for queued in tuple(taken) if queued.type == "new_request")
    if waiting >= max_pending:
        raise QueueFullError(f"stage inbox is full (max_pending={max_pending})")


class SyncIdSet:
    """A :class:`BoundedIdSet` behind a lock, for ids touched from several threads.

    ``abort`` runs on the stage's event loop while the serve loop checks the
    same ids on the scheduler thread, so every operation is atomic, and
    :meth:`add` reports whether the id is new so callers can run a
    once-per-id side effect (the abort callback) exactly once.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._ids = BoundedIdSet(capacity)
        self._lock = threading.Lock()

    def add(self, request_id: str) -> bool:
        """Remember ``request_id``; return True if it was not already remembered."""
        with self._lock:
            fresh = request_id not in self._ids
            self._ids.add(request_id)
            return fresh

    def pop(self, request_id: str) -> bool:
        """Forget ``request_id``; return whether it was remembered."""
        with self._lock:
            return self._ids.pop(request_id)

    def discard(self, request_id: str) -> None:
        """Forget ``request_id`` if remembered."""
        with self._lock:
            self._ids.discard(request_id)

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._ids

    def __len__(self) -> int:
        with self._lock:
            return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        # A snapshot: iterating the live dict while another thread adds would raise.
        with self._lock:
            return iter(list(self._ids))


class ThreadLoop:
    """A private asyncio event loop for one thread, created on first use.

    Async compute functions run to completion on it; sync-only schedulers
    never pay for a loop (a selector and a socket pair).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` to completion on this thread's loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_await(awaitable))

    def close(self) -> None:
        """Close the loop if one was created."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def call_sync_or_async(
    fn: Callable[..., Any], *args: Any, loop: ThreadLoop | None, sink: ChunkSink | None = None
) -> Any:
    """Call ``fn(*args)``; if it returns an awaitable, run it on ``loop``; if it returns a generator, run
    that, each yield into ``sink`` (see :mod:`omni_trio.scheduling.generated`).

    ``loop`` None means ``fn`` runs on the stage's event loop (inline), where
    nothing may be awaited: an awaitable or an async generator raises TypeError.
    ``sink`` None means the caller streams nothing: a generator raises TypeError.
    """
    result = fn(*args)
    name = getattr(fn, "__qualname__", fn)
    if inspect.isgenerator(result) or inspect.isasyncgen(result):
        if sink is None:
            if inspect.isgenerator(result):
                result.close()
            raise TypeError(f"{name!r} is a generator, but this scheduler does not stream what compute yields")
        if inspect.isgenerator(result):
            return drive(result, sink)
        if loop is None:
            raise TypeError(f"{name!r} is an async generator, but inline compute must be synchronous")
        loop.run(drive_async(result, sink))
        return args[0]  # an async generator returns nothing: its result is what it was given
    if inspect.isawaitable(result):
        if loop is None:
            if inspect.iscoroutine(result):
                result.close()
            raise TypeError(
                f"{name!r} returned an awaitable, but inline compute must be synchronous; drop inline=True "
                "(an async def compute_fn then runs on an asyncio loop of the scheduler thread)"
            )
        return loop.run(result)
    return result


def call_logged(callback: Callable[..., object] | None, *args: Any, what: str) -> None:
    """Run a user cleanup callback; its errors are logged, never raised.

    Abort and shutdown callbacks run on the stage's event loop or during
    teardown, where an exception would take down far more than one request.
    """
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        logger.exception("%s failed", what)


def result_message(request_id: str, data: object) -> OutgoingMessage:
    """The ``result`` message for one request."""
    return OutgoingMessage(request_id=request_id, type="result", data=data)


def error_message(request_id: str, error: BaseException) -> OutgoingMessage:
    """The ``error`` message for one request; the stage fails it with ``str(error)``."""
    return OutgoingMessage(request_id=request_id, type="error", data=error)


def batch_results(results: object, requests: int) -> Sequence[Any]:
    """What a ``batch_compute_fn`` returned for ``requests`` payloads, checked: a sequence, one result per
    payload (in order); anything else raises ValueError, which fails the whole batch."""
    if not isinstance(results, Sequence) or len(results) != requests:
        count = len(results) if isinstance(results, Sequence) else type(results).__name__
        raise ValueError(f"batch_compute_fn returned {count} results for {requests} requests")
    return results


class BatchWindow:
    """The batching window of one batch.

    Armed at the first request when ``armed_at_first`` (the reference's
    ``batch_wait_when_idle=True``), otherwise only once a second request
    joins: an idle stage runs a lone request at once, a backlog still
    batches fully.
    """

    def __init__(self, wait_s: float, *, armed_at_first: bool) -> None:
        self._wait_s = wait_s
        self._deadline = time.monotonic() + wait_s if armed_at_first else None

    def joined(self) -> None:
        """A request joined the batch: arm the window if it is not armed yet."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self._wait_s

    def next_message(
        self, take_nowait: Callable[[], IncomingMessage | None], inbox: queue.Queue[IncomingMessage]
    ) -> IncomingMessage | None:
        """The next queued message; when none is queued, wait for one while the window is open.

        Returns None when the batch is complete: nothing queued and the window
        unarmed or over. This and the outbox's first-chunk hand-over
        (:class:`~omni_trio.scheduling.outbox.Outbox`) are the schedulers'
        timed waits: real deadlines, not polls.
        """
        message = take_nowait()
        if message is not None or self._deadline is None:
            return message
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            return inbox.get(timeout=remaining)
        except queue.Empty:
            return None


class BatchingOptions:
    """The batching options SimpleScheduler and StreamingSimpleScheduler share, checked
    once: a value out of range raises ValueError naming the option."""

    batch_compute_fn: Callable[[Any], Any] | None
    max_batch_size: int
    max_batch_wait_s: float
    batch_wait_when_idle: bool
    request_cost_fn: Callable[[Any], int] | None
    max_batch_cost: int | None

    def _init_batching(
        self,
        batch_compute_fn: Callable[[Any], Any] | None,
        max_batch_size: int,
        max_batch_wait_ms: float,
        batch_wait_when_idle: bool,
        request_cost_fn: Callable[[Any], int] | None,
        max_batch_cost: int | None,
    ) -> None:
        self.batch_compute_fn = batch_compute_fn
        self.max_batch_size = checked_count("max_batch_size", max_batch_size)
        self.max_batch_wait_s = checked_wait_ms("max_batch_wait_ms", max_batch_wait_ms) / 1000.0
        self.batch_wait_when_idle = bool(batch_wait_when_idle)
        self.request_cost_fn = request_cost_fn
        self.max_batch_cost = checked_limit("max_batch_cost", max_batch_cost, minimum=0)

    def message_cost(self, msg: IncomingMessage) -> int:
        """Cost of a message toward ``max_batch_cost`` (0 unless a costed ``new_request``)."""
        if self.request_cost_fn is None or msg.type != "new_request":
            return 0
        return max(int(self.request_cost_fn(msg.data)), 0)


class RunningComputes:
    """The requests whose user compute runs now, each with when it started (``time.monotonic()``).

    Schedulers call :meth:`start` and :meth:`finish` around each call of user
    code; the stage reads :meth:`snapshot` (through the scheduler's
    ``running_computes()``) to tell a compute that outlives its aborted request,
    which nobody waits for any more. No lock: a dict's item assignment, ``pop``
    and ``copy`` are each atomic under the GIL, and this costs a compute ~0.3 µs.
    """

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def start(self, request_ids: Iterable[str]) -> None:
        """``request_ids`` start computing."""
        now = time.monotonic()
        for request_id in request_ids:
            self._since[request_id] = now

    def finish(self, request_ids: Iterable[str]) -> None:
        """``request_ids`` finished computing (however it ended)."""
        for request_id in request_ids:
            self._since.pop(request_id, None)

    def snapshot(self) -> dict[str, float]:
        """``request_id -> start time`` of every compute running now."""
        return self._since.copy()
