"""ThreadedSimpleScheduler: blocking per-request work on a thread pool.

For CPU-bound or blocking stages: each ``new_request`` runs ``compute_fn`` on
a ``ThreadPoolExecutor`` thread (or is handed to ``dispatch_fn``, which wraps
an async engine and returns a ``concurrent.futures.Future``), at most
``max_concurrency`` at a time.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import trio

from omni_trio.scheduling._support import (
    WAKEUP,
    RunningComputes,
    SyncIdSet,
    ThreadLoop,
    call_logged,
    call_sync_or_async,
    checked_limit,
    checked_max_pending,
    error_message,
    refuse_if_full,
    result_message,
)
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.generated import ChunkSink, GenerationStopped, compute_async, stream_message
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.on_loop import LoopComputes, checked_for_trio_loop
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage

logger = logging.getLogger(__name__)


class ThreadedSimpleScheduler:
    """Runs up to ``max_concurrency`` requests at once on a thread pool.

    The serve loop takes a message only while fewer than ``max_concurrency``
    requests are pending, so excess work waits in the inbox. Results leave in
    completion order. Abort frees a pending request's slot at once (a thread
    already running it finishes unobserved); ``abort_callback`` runs at abort
    time and again when an aborted or cancelled future completes, so cleanup
    also sees side effects of a compute that finished after the abort.

    ``compute_fn`` may be a generator function, sync or async: what it
    yields goes out as the request's stream chunks, before its result (see
    :mod:`omni_trio.scheduling.generated`); an abort closes it.

    An ``async def`` ``compute_fn`` runs on the pool too, each call to
    completion on an asyncio event loop of its own (it may await asyncio).
    ``run_on_trio_loop=True`` runs it on the stage's trio event loop instead
    (up to ``max_concurrency`` at once, no thread hand-off; it must await trio
    only; an abort cancels it, and ``abort_callback`` runs again once the
    cancelled compute ended).
    """

    def __init__(
        self,
        compute_fn: Callable[[Any], Any] | None = None,
        *,
        max_concurrency: int | None = 8,
        abort_callback: Callable[[str], object] | None = None,
        dispatch_fn: Callable[[Any], Future[Any]] | None = None,
        max_pending: int | None = None,
        run_on_trio_loop: bool = False,
    ) -> None:
        if run_on_trio_loop:
            if dispatch_fn is not None or max_concurrency is None:
                raise ValueError("run_on_trio_loop=True runs compute_fn, max_concurrency at a time: drop dispatch_fn")
            checked_for_trio_loop(compute_fn)
        if dispatch_fn is None:
            if compute_fn is None:
                raise ValueError("ThreadedSimpleScheduler needs compute_fn or dispatch_fn")
            if max_concurrency is None:
                raise ValueError("max_concurrency=None (no cap) is only allowed with dispatch_fn")
        self.max_pending = checked_max_pending(max_pending)
        self.inbox: queue.Queue[IncomingMessage] = Inbox()
        self.outbox = Outbox()
        self.compute_fn = compute_fn
        self.dispatch_fn = dispatch_fn
        self.max_concurrency = checked_limit("max_concurrency", max_concurrency)
        self.abort_callback = abort_callback
        # dispatch_fn owns its own execution; a pool would only sit idle.
        self._executor = (
            ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="threaded-scheduler")
            if dispatch_fn is None
            else None
        )
        # One condition guards all bookkeeping below and doubles as the
        # capacity wait; it is re-entrant so a future's done callback may run
        # synchronously inside a locked section.
        self._cond = threading.Condition()
        self._pending: dict[str, Future[Any]] = {}
        self._computes = RunningComputes()
        self._queued: set[str] = set()
        self._claiming: set[str] = set()
        self._tombstones: set[str] = set()
        # Aborts for ids this scheduler has not seen may never be followed by
        # the request, so they are kept in a bounded (oldest-first) set.
        self._speculative = SyncIdSet()
        self._stopping = False
        #: How long compute ran here (``stats()``'s ``busy_seconds``; a ``dispatch_fn``'s work is not seen).
        self.busy = BusyTime()
        #: Async compute on the stage's trio loop (see :meth:`attach_loop`); None: compute on the pool.
        self._on_loop = (
            LoopComputes(self, self.max_concurrency)
            if run_on_trio_loop and self.max_concurrency is not None
            else None
        )

    def warm_up_serving_thread(self) -> None:
        """Build thread-local state on the scheduler thread (nothing by default)."""

    def start(self) -> None:
        """Serve until :meth:`stop`; blocks the calling (scheduler) thread."""
        try:
            while self._wait_for_capacity():
                msg = self.inbox.get()
                if msg.type == "new_request":
                    self._dispatch(msg)
            if self._on_loop is not None:
                # The computes on the stage's loop finish before the scheduler counts as stopped.
                self._on_loop.wait_finished()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)

    def attach_loop(self, nursery: trio.Nursery) -> None:
        """Called by the stage on its event loop: with ``run_on_trio_loop``, ``compute_fn`` runs in
        ``nursery`` from now on (nothing happens otherwise)."""
        if self._on_loop is not None:
            self._on_loop.attach(nursery)

    def stop(self) -> None:
        """Make ``start`` return promptly; queued pool work is cancelled, not awaited."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.inbox.put(WAKEUP)
        if self._on_loop is not None:
            self._on_loop.stop()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def abort(self, request_id: str) -> None:
        """Drop ``request_id`` wherever it is; quick and thread-safe."""
        if self._on_loop is not None and self._on_loop.attached:
            self._speculative.add(request_id)  # a queued one is skipped, a running one cancelled
            self._on_loop.cancel(request_id)
            call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
            return
        with self._cond:
            future = self._pending.pop(request_id, None)
            if future is not None:
                self._cond.notify_all()
            elif request_id in self._queued or request_id in self._claiming:
                self._tombstones.add(request_id)
            else:
                self._speculative.add(request_id)
        if future is not None:
            # Outside the lock: a successful cancel runs done callbacks right here.
            future.cancel()
        call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")

    def enqueue(self, msg: IncomingMessage) -> None:
        """Hand a message to the scheduler (stage event loop; never blocks).

        Raises :class:`QueueFullError` beyond ``max_pending`` requests waiting for a slot.
        """
        loop = self._on_loop if self._on_loop is not None and self._on_loop.attached else None
        refuse_if_full(self.max_pending, msg, self.inbox, () if loop is None else loop.waiting)
        if loop is not None:
            if msg.type == "new_request":
                loop.submit(msg)
            return
        if msg.type == "new_request":
            with self._cond:
                if self._speculative.pop(msg.request_id):
                    # Aborted before it arrived: make the tombstone definite so
                    # eviction from the bounded set cannot let it through.
                    self._tombstones.add(msg.request_id)
                else:
                    self._queued.add(msg.request_id)
        self.inbox.put(msg)

    def _wait_for_capacity(self) -> bool:
        """Block until a slot is free; False once stopping."""
        with self._cond:
            while (
                not self._stopping and self.max_concurrency is not None and len(self._pending) >= self.max_concurrency
            ):
                self._cond.wait()
            return not self._stopping

    def _dispatch(self, msg: IncomingMessage) -> None:
        request_id = msg.request_id
        with self._cond:
            self._queued.discard(request_id)
            if self._stopping:
                return
            if request_id in self._tombstones:
                self._tombstones.discard(request_id)
                return
            if self._speculative.pop(request_id):
                return
            self._claiming.add(request_id)
        # Claim outside the lock: dispatch_fn is user code and abort() must stay quick.
        try:
            future = self._submit(msg.data, request_id)
        except Exception as exc:
            with self._cond:
                self._claiming.discard(request_id)
                aborted = request_id in self._tombstones
                self._tombstones.discard(request_id)
            if not aborted:
                logger.exception("ThreadedSimpleScheduler: dispatch failed for %s", request_id)
                self.outbox.put(error_message(request_id, exc))
            return
        with self._cond:
            self._claiming.discard(request_id)
            aborted = request_id in self._tombstones
            if aborted:
                self._tombstones.discard(request_id)
            else:
                self._pending[request_id] = future
        if aborted:
            future.cancel()
            future.add_done_callback(
                lambda _: call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
            )
        else:
            future.add_done_callback(functools.partial(self._finish, request_id))

    def _submit(self, payload: Any, request_id: str) -> Future[Any]:
        if self.dispatch_fn is not None:
            return self.dispatch_fn(payload)
        assert self._executor is not None
        # In a copy of the scheduler thread's context: ot.empty finds the stage's pool there.
        return self._executor.submit(contextvars.copy_context().run, self._run_one, payload, request_id)

    def running_computes(self) -> dict[str, float]:
        """``request_id -> time.monotonic()`` at which its compute started, for every ``compute_fn``
        running now on the pool (a ``dispatch_fn``'s work is its own)."""
        return self._computes.snapshot()

    def _run_one(self, payload: Any, request_id: str) -> Any:
        # Pool threads come and go, so each call gets (and closes) its own loop
        # instead of leaving one open per thread.
        loop = ThreadLoop()
        self._computes.start((request_id,))
        try:
            assert self.compute_fn is not None
            sink = self._chunk_sink(request_id)
            return self.busy.call(call_sync_or_async, self.compute_fn, payload, loop=loop, sink=sink)
        finally:
            self._computes.finish((request_id,))
            loop.close()

    async def compute_on_loop(self, msg: IncomingMessage) -> None:
        """One request's ``async def`` ``compute_fn`` on the stage's loop (an abort cancels it)."""
        request_id = msg.request_id
        if self._speculative.pop(request_id):
            return  # aborted while it waited
        assert self.compute_fn is not None
        started = time.perf_counter_ns()
        self._computes.start((request_id,))
        try:
            result = await compute_async(self.compute_fn, msg.data, self._chunk_sink(request_id))
        except BaseException as exc:
            if self._speculative.pop(request_id):
                # Aborted (and cancelled): late cleanup, as for a pool compute that ends after its abort.
                call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
            elif isinstance(exc, Exception):
                logger.error("ThreadedSimpleScheduler: compute failed for %s", request_id, exc_info=exc)
                self.outbox.put(error_message(request_id, exc))
            if not isinstance(exc, Exception):
                raise  # a cancellation belongs to its scope
            return
        finally:
            self._computes.finish((request_id,))
            self.busy.add(time.perf_counter_ns() - started)
        if self._speculative.pop(request_id):
            call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
            return
        self.outbox.put(result_message(request_id, result))

    def _chunk_sink(self, request_id: str) -> ChunkSink:
        """Where a generator ``compute_fn`` computing ``request_id`` sends what it yields."""

        def send(chunk: object) -> None:
            if self._dropped(request_id):
                raise GenerationStopped(request_id)
            self.outbox.put(stream_message(request_id, chunk))

        return send

    def _dropped(self, request_id: str) -> bool:
        """Whether ``request_id`` was aborted (or the scheduler stopped) while it computes."""
        if self._on_loop is not None and self._on_loop.attached:
            return request_id in self._speculative
        with self._cond:
            if self._stopping or request_id in self._tombstones:
                return True
            return request_id not in self._pending and request_id not in self._claiming

    def _finish(self, request_id: str, future: Future[Any]) -> None:
        with self._cond:
            owned = self._pending.get(request_id) is future
            if owned:
                del self._pending[request_id]
                self._cond.notify_all()
        if not owned or future.cancelled():
            # Aborted (abort popped it) or cancelled at stop: late cleanup, no output.
            call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
            return
        exc = future.exception()
        if exc is not None:
            logger.error("ThreadedSimpleScheduler: compute failed for %s", request_id, exc_info=exc)
            self.outbox.put(error_message(request_id, exc))
        else:
            self.outbox.put(result_message(request_id, future.result()))
