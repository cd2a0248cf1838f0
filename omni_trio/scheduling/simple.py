"""SimpleScheduler: run a function per request, optionally batched or concurrent.

For stages that just run a function (preprocessing, encoders, decode). Serial
mode (``max_concurrency == 1``) can coalesce requests into batches for a
``batch_compute_fn``; concurrent mode runs ``compute_fn`` on N worker threads.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import trio

from omni_trio.scheduling._support import (
    WAKEUP,
    BatchingOptions,
    RunningComputes,
    SyncIdSet,
    ThreadLoop,
    batch_results,
    call_logged,
    call_sync_or_async,
    checked_count,
    checked_max_pending,
    error_message,
    refuse_if_full,
    result_message,
)
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.generated import ChunkSink, GenerationStopped, batch_sink, compute_async, stream_message
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.on_loop import LoopComputes, checked_for_trio_loop
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage
from omni_trio.scheduling.simple_serving import BatchCollector, WorkerThreads

logger = logging.getLogger(__name__)

#: ``compute_fn(payload)``: returns the result, or a coroutine/awaitable of it.
ComputeFn = Callable[[Any], Any]
#: ``batch_compute_fn(payloads)``: returns (an awaitable of) a same-length
#: sequence; an element that is an exception fails only its request.
BatchComputeFn = Callable[[list[Any]], Any]


class SimpleScheduler(BatchingOptions):
    """Runs ``compute_fn`` (or ``batch_compute_fn``) for each ``new_request``.

    Serial mode takes one message at a time and may gather a batch: with
    ``batch_wait_when_idle=False`` (the default) an idle stage runs a lone
    request at once and the ``max_batch_wait_ms`` window opens only when a
    second request joins; a backlog still batches fully. Concurrent mode
    (``max_concurrency > 1``) runs that many worker threads, no batching.

    ``compute_fn`` (and ``batch_compute_fn``) may be a generator function,
    sync or async: what it yields goes out as the request's stream chunks,
    before its result (see :mod:`omni_trio.scheduling.generated`).

    Every exception from user compute becomes an ``error`` message for the
    request(s) it belongs to; the loop keeps serving. Aborted requests never
    enter a batch and their outputs are dropped.

    ``max_pending`` bounds the requests waiting to start: :meth:`enqueue` of
    a further ``new_request`` raises :class:`QueueFullError` (the stage fails
    that request, which the caller sees as ``RequestFailed``). None: unbounded.

    Where ``compute_fn`` runs: on the scheduler thread (or its
    ``max_concurrency`` worker threads). An ``async def`` one (or one that
    returns an awaitable) runs to completion on an asyncio event loop of
    that thread, as in SGLang-Omni, so it may await asyncio (``asyncio.sleep``,
    an asyncio client); an abort drops its result. ``run_on_trio_loop=True``
    runs an ``async def`` compute function (without ``batch_compute_fn``)
    on the stage's trio event loop instead, up to ``max_concurrency``
    requests at a time, with no thread hand-off: for a function that awaits
    trio only (never asyncio) and never blocks; an abort cancels it.

    ``inline=True`` is for a ``compute_fn`` that is quick and never blocks
    (routing, light preprocessing, a merge): it runs in :meth:`enqueue`, on
    the stage's event loop, which saves the two thread hand-offs per request
    that the scheduler thread costs. Anything that blocks (a model, I/O)
    would stall every stage of the process, so inline mode takes a
    synchronous ``compute_fn`` only, one request at a time: no batching, no
    ``max_concurrency``.
    """

    def __init__(
        self,
        compute_fn: ComputeFn,
        *,
        batch_compute_fn: BatchComputeFn | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = False,
        request_cost_fn: Callable[[Any], int] | None = None,
        max_batch_cost: int | None = None,
        max_concurrency: int = 1,
        abort_callback: Callable[[str], object] | None = None,
        shutdown_callback: Callable[[], object] | None = None,
        request_arrival_hook: Callable[[Any], object] | None = None,
        max_pending: int | None = None,
        inline: bool = False,
        run_on_trio_loop: bool = False,
    ) -> None:
        self.max_pending = checked_max_pending(max_pending)
        self.max_concurrency = checked_count("max_concurrency", max_concurrency)
        if self.max_concurrency > 1 and batch_compute_fn is not None:
            raise ValueError("max_concurrency > 1 and batch_compute_fn are mutually exclusive")
        if inline and (batch_compute_fn is not None or self.max_concurrency > 1):
            raise ValueError(
                "inline=True runs compute_fn on the stage's event loop one request at a time: "
                "drop batch_compute_fn and max_concurrency, or drop inline"
            )
        if run_on_trio_loop:
            checked_for_trio_loop(compute_fn, batch_compute_fn=batch_compute_fn, inline=inline)
        self.inline = inline
        self.inbox: queue.Queue[IncomingMessage] = Inbox()
        self.outbox = Outbox()
        self.compute_fn = compute_fn
        self._init_batching(
            batch_compute_fn, max_batch_size, max_batch_wait_ms, batch_wait_when_idle, request_cost_fn, max_batch_cost
        )
        self.abort_callback = abort_callback
        self.request_arrival_hook = request_arrival_hook
        #: Messages taken from the inbox but not handled yet; served before the inbox.
        self.pending_messages: collections.deque[IncomingMessage] = collections.deque()
        self._shutdown_callback = shutdown_callback
        self._shutdown_lock = threading.Lock()
        self._aborted = SyncIdSet()
        self._computes = RunningComputes()
        self._stopping = threading.Event()
        self._batches = BatchCollector(self, source=self)
        self._workers = WorkerThreads(self.max_concurrency, self, self._stopping)
        #: How long compute ran here (``stats()``'s ``busy_seconds``).
        self.busy = BusyTime()
        #: Async compute on the stage's trio loop (see :meth:`attach_loop`); None: compute on threads.
        self._on_loop = LoopComputes(self, self.max_concurrency) if run_on_trio_loop else None

    # ------------------------------------------------------------------
    # StageScheduler contract
    # ------------------------------------------------------------------

    def warm_up_serving_thread(self) -> None:
        """Build thread-local state on the scheduler thread (nothing by default)."""

    def start(self) -> None:
        """Serve until :meth:`stop`; blocks the calling (scheduler) thread."""
        if self.max_concurrency > 1:
            self._workers.serve(self._take_on_worker)
        else:
            self._serve_serially()
        if self._on_loop is not None:
            # The computes on the stage's loop finish before the scheduler counts as stopped.
            self._on_loop.wait_finished()

    def attach_loop(self, nursery: trio.Nursery) -> None:
        """Called by the stage on its event loop: with ``run_on_trio_loop``, ``compute_fn`` runs in
        ``nursery`` from now on (nothing happens otherwise)."""
        if self._on_loop is not None:
            self._on_loop.attach(nursery)

    def stop(self) -> None:
        """Make ``start`` return; safe before, during or after ``start``, and repeatable.

        The ``wakeup`` sentinel unblocks a ``start`` waiting on the inbox; a
        compute already running finishes first. ``shutdown_callback`` runs
        on the first call only.
        """
        self._stopping.set()
        self.inbox.put(WAKEUP)
        if self._on_loop is not None:
            self._on_loop.stop()
        with self._shutdown_lock:
            callback, self._shutdown_callback = self._shutdown_callback, None
        call_logged(callback, what=f"{type(self).__name__} shutdown_callback")

    def abort(self, request_id: str) -> None:
        """Drop ``request_id``: skip it if queued, drop its output if running.

        ``abort_callback`` runs once per id, however many times it is aborted.
        """
        if self._aborted.add(request_id):
            call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")
        if self._on_loop is not None:
            self._on_loop.cancel(request_id)

    def enqueue(self, msg: IncomingMessage) -> None:
        """Hand a message to the scheduler (stage event loop; never blocks).

        Runs ``request_arrival_hook`` for a ``new_request`` first, so a stage
        can account for the request before the scheduler thread sees it.
        Raises :class:`QueueFullError` beyond ``max_pending`` waiting requests.
        """
        loop = self._on_loop if self._on_loop is not None and self._on_loop.attached else None
        refuse_if_full(self.max_pending, msg, self.inbox, self.pending_messages if loop is None else loop.waiting)
        if msg.type == "new_request" and self.request_arrival_hook is not None:
            self.request_arrival_hook(msg.data)
        if loop is not None:
            if msg.type == "new_request" and not self._skip_before_compute(msg):
                loop.submit(msg)
        elif not self.inline:
            self.inbox.put(msg)
        elif msg.type == "new_request" and not self._skip_before_compute(msg):
            self._run_one(msg, None)

    def running_computes(self) -> dict[str, float]:
        """``request_id -> time.monotonic()`` at which its compute started, for every compute running now."""
        return self._computes.snapshot()

    def is_aborted(self, request_id: str) -> bool:
        """Whether ``request_id`` was aborted here.

        Aborted ids stay remembered (in a bounded set, oldest forgotten
        first) rather than being consumed when their message is skipped, so
        a repeated abort never runs ``abort_callback`` a second time.
        """
        return request_id in self._aborted

    # ------------------------------------------------------------------
    # Serial mode
    # ------------------------------------------------------------------

    def _serve_serially(self) -> None:
        loop = ThreadLoop()
        try:
            while not self._stopping.is_set():
                msg = self._batches.next_message()
                if msg.type != "new_request" or self._skip_before_compute(msg):
                    continue
                self._process(msg, loop)
        finally:
            loop.close()

    def collect_batch(self, first: IncomingMessage) -> list[IncomingMessage]:
        """Gather the batch that ``first`` opens.

        Only a batch function with ``max_batch_size > 1`` gathers. Requests
        already queued always join; the loop waits for more only while the
        window is armed: from ``first`` if ``batch_wait_when_idle``, else from
        the moment a second request joins. A request over ``max_batch_cost``
        goes back to the front of ``pending_messages`` (``first`` is always
        admitted); other message types go to its back. Aborted requests are
        dropped here and never enter the batch.
        """
        return self._batches.collect(first, skip=self._skip_before_compute, cost_failed=self._emit_error)

    def _process(self, first: IncomingMessage, loop: ThreadLoop) -> None:
        try:
            batch = self.collect_batch(first)
        except Exception as exc:
            # Only the first request's own cost can fail here; joiners are handled inside.
            logger.exception("%s: collecting a batch failed for %s", type(self).__name__, first.request_id)
            self._fail([first], exc)
            return
        # Aborts that landed during the window still keep their request out of the batch.
        live = [msg for msg in batch if not self._skip_before_compute(msg)]
        if not live:
            return
        if self.batch_compute_fn is None or len(live) == 1:
            for msg in live:
                self._run_one(msg, loop)
        else:
            self._run_batch(live, loop)

    def _run_batch(self, batch: list[IncomingMessage], loop: ThreadLoop) -> None:
        assert self.batch_compute_fn is not None
        try:
            ids = [msg.request_id for msg in batch]
            self._computes.start(ids)
            try:
                payloads = [msg.data for msg in batch]
                sink = batch_sink(ids, self._chunk_sink)
                returned = self.busy.call(call_sync_or_async, self.batch_compute_fn, payloads, loop=loop, sink=sink)
            finally:
                self._computes.finish(ids)
            results = batch_results(returned, len(batch))
        except Exception as exc:
            logger.exception("%s: batch of %d failed", type(self).__name__, len(batch))
            self._fail(batch, exc)
            return
        for msg, result in zip(batch, results, strict=True):
            if self.is_aborted(msg.request_id):
                continue
            if isinstance(result, BaseException):
                self._emit_error(msg.request_id, result)
            else:
                self._emit_result(msg.request_id, result)

    # ------------------------------------------------------------------
    # Concurrent mode
    # ------------------------------------------------------------------

    def _take_on_worker(self, msg: IncomingMessage, loop: ThreadLoop) -> None:
        """What a worker thread does with a message it took: compute a live ``new_request``."""
        if msg.type != "new_request" or self._skip_before_compute(msg):
            return
        self._run_one(msg, loop)

    # ------------------------------------------------------------------
    # Shared by both modes
    # ------------------------------------------------------------------

    def _run_one(self, msg: IncomingMessage, loop: ThreadLoop | None) -> None:
        request_id = msg.request_id
        try:
            self._computes.start((request_id,))
            try:
                sink = self._chunk_sink(request_id)
                result = self.busy.call(call_sync_or_async, self.compute_fn, msg.data, loop=loop, sink=sink)
            finally:
                self._computes.finish((request_id,))
        except Exception as exc:
            if self.is_aborted(request_id):
                return
            logger.exception("%s: compute_fn failed for %s", type(self).__name__, request_id)
            self._emit_error(request_id, exc)
            return
        if self.is_aborted(request_id):
            return
        self._emit_result(request_id, result)

    async def compute_on_loop(self, msg: IncomingMessage) -> None:
        """:meth:`_run_one` for an ``async def`` ``compute_fn`` on the stage's loop (an abort cancels it)."""
        request_id = msg.request_id
        if self._skip_before_compute(msg):
            return
        started = time.perf_counter_ns()
        self._computes.start((request_id,))
        try:
            result = await compute_async(self.compute_fn, msg.data, self._chunk_sink(request_id))
        except Exception as exc:
            if not self.is_aborted(request_id):
                logger.exception("%s: compute_fn failed for %s", type(self).__name__, request_id)
                self._emit_error(request_id, exc)
            return
        finally:
            self._computes.finish((request_id,))
            self.busy.add(time.perf_counter_ns() - started)
        if not self.is_aborted(request_id):
            self._emit_result(request_id, result)

    def _chunk_sink(self, request_id: str) -> ChunkSink:
        """Where a generator ``compute_fn`` computing ``request_id`` sends what it yields."""

        def send(chunk: object) -> None:
            if self.is_aborted(request_id):
                raise GenerationStopped(request_id)
            self.outbox.put(stream_message(request_id, chunk))

        return send

    def _skip_before_compute(self, msg: IncomingMessage) -> bool:
        """True if ``msg``'s request was aborted and must not be computed.

        Subclasses that track per-request state hook in here.
        """
        return self.is_aborted(msg.request_id)

    def _fail(self, batch: list[IncomingMessage], exc: BaseException) -> None:
        for msg in batch:
            if not self.is_aborted(msg.request_id):
                self._emit_error(msg.request_id, exc)

    def _emit_result(self, request_id: str, result: object) -> None:
        self.outbox.put(result_message(request_id, result))

    def _emit_error(self, request_id: str, error: BaseException) -> None:
        self.outbox.put(error_message(request_id, error))
