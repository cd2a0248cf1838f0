"""The state, inbox and output of a streaming scheduler: what its dispatch (:mod:`.streaming`) builds on.

:class:`StreamingCore` holds the per-request state (stream payloads, done
signals that came before their payload, aborted and completed ids, the
re-entrant state lock), takes messages from the inbox, handles aborts and
puts output into the outbox. :class:`~omni_trio.scheduling.streaming.StreamingSimpleScheduler`
adds what each message does.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from omni_trio.payload import StagePayload
from omni_trio.scheduling._support import (
    WAKEUP,
    BatchingOptions,
    RunningComputes,
    SyncIdSet,
    call_logged,
    checked_limit,
    checked_max_pending,
    error_message,
    refuse_if_full,
    result_message,
)
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage
from omni_trio.scheduling.simple import BatchComputeFn, ComputeFn
from omni_trio.scheduling.streaming_hooks import StreamingHooks


class StreamingCore(StreamingHooks, BatchingOptions):
    """The request state, inbox taking, aborts and output of a streaming scheduler (see the module)."""

    # The class knobs of StreamingSimpleScheduler (see there); a subclass sets them on its class.
    can_batch_stream_chunks: bool = False
    stream_chunk_batch_max: int | None = None
    stream_chunk_batch_distinct_requests: bool = False

    def __init__(
        self,
        compute_fn: ComputeFn | None,
        *,
        batch_compute_fn: BatchComputeFn | None = None,
        max_batch_size: int = 1,
        max_batch_wait_ms: float = 0,
        batch_wait_when_idle: bool = False,
        request_cost_fn: Callable[[Any], int] | None = None,
        max_batch_cost: int | None = None,
        abort_callback: Callable[[str], object] | None = None,
        max_pending: int | None = None,
    ) -> None:
        self.max_pending = checked_max_pending(max_pending)
        checked_limit("stream_chunk_batch_max", self.stream_chunk_batch_max)
        self.inbox: queue.Queue[IncomingMessage] = Inbox()
        self.outbox = Outbox()
        self.compute_fn = compute_fn
        self._init_batching(
            batch_compute_fn, max_batch_size, max_batch_wait_ms, batch_wait_when_idle, request_cost_fn, max_batch_cost
        )
        self.abort_callback = abort_callback
        #: Payloads of streaming requests, by request id, until they complete.
        self.stream_payloads: dict[str, StagePayload] = {}
        #: Requests whose ``stream_done`` arrived before their payload.
        self.pending_done: set[str] = set()
        #: Messages taken from the inbox but not handled yet; served first.
        self.pending_messages: collections.deque[IncomingMessage] = collections.deque()
        #: Held while hooks run on request state; re-entrant so hooks may call
        #: back into :meth:`complete_stream_request`.
        self.state_lock = threading.RLock()
        self.aborted_request_ids = SyncIdSet()
        self._computes = RunningComputes()
        #: Requests that finished here before a ``stream_done`` came: their late
        #: done is ignored instead of creating state nobody will clear (a chunk, or
        #: a second done, under such an id belongs to a new request reusing it).
        self.completed_request_ids = SyncIdSet()
        #: Requests here whose stream already ended (their ``stream_done`` came).
        self._stream_ended: set[str] = set()
        self._stopping = threading.Event()
        self._serving_thread: int | None = None

    @functools.cached_property
    def busy(self) -> BusyTime:
        """How long the hooks and compute functions ran here (``stats()``'s ``busy_seconds``)."""
        # Created on first use, not in __init__: a subclass may not call our __init__.
        return BusyTime()

    def warm_up_serving_thread(self) -> None:
        """Build thread-local state on the scheduler thread (nothing by default)."""

    def stop(self) -> None:
        """Make ``start`` return; the ``wakeup`` sentinel unblocks a waiting loop."""
        self._stopping.set()
        self.inbox.put(WAKEUP)

    def enqueue(self, msg: IncomingMessage) -> None:
        """Hand a message to the scheduler (stage event loop; never blocks).

        Raises :class:`QueueFullError` for a ``new_request`` beyond ``max_pending`` waiting ones.
        """
        # getattr: a subclass that does not call our __init__ has no limit.
        refuse_if_full(getattr(self, "max_pending", None), msg, self.inbox, self.pending_messages)
        self.inbox.put(msg)

    def abort(self, request_id: str) -> None:
        """Drop the request's state and ignore its later messages.

        ``abort_callback`` runs once per id, however many times it is aborted.
        """
        fresh = self.aborted_request_ids.add(request_id)
        if threading.get_ident() == self._serving_thread:
            self.clear_request_state(request_id, keep_aborted=True)
        else:
            # From the stage's event loop: never wait for state_lock there (a hook may
            # hold it for a whole compute step); the serve loop clears the state.
            self.inbox.put(IncomingMessage(request_id, "abort"))
        if fresh:
            call_logged(self.abort_callback, request_id, what=f"abort_callback for {request_id!r}")

    def is_aborted(self, request_id: str) -> bool:
        """Whether ``request_id`` was aborted here."""
        return request_id in self.aborted_request_ids

    def running_computes(self) -> dict[str, float]:
        """``request_id -> time.monotonic()`` at which the message being handled for it was taken up
        (user hooks run while it is handled), for every request being handled now."""
        return self._computes.snapshot()

    def _absorb_abort(self, msg: IncomingMessage) -> bool:
        """Handle an ``abort`` note that :meth:`abort` queued from the stage's thread.

        The request's state is cleared here, on the serving thread where the hooks
        run. Batch collectors call this too: a note about one request is consumed
        where it is found, so it never ends (or cuts short) another request's batch.
        """
        if msg.type != "abort":
            return False
        self.clear_request_state(msg.request_id, keep_aborted=True)
        return True

    def _take(self) -> IncomingMessage:
        if self.pending_messages:
            return self.pending_messages.popleft()
        return self.inbox.get()

    def _take_nowait(self) -> IncomingMessage | None:
        if self.pending_messages:
            return self.pending_messages.popleft()
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            return None

    def clear_request_state(self, request_id: str, *, keep_aborted: bool = False) -> None:
        """Forget everything about ``request_id`` here (subclass state included)."""
        with self.state_lock:
            self.stream_payloads.pop(request_id, None)
            self.pending_done.discard(request_id)
            self._stream_ended.discard(request_id)
            self.clear_stream_state(request_id)
            if not keep_aborted:
                self.aborted_request_ids.discard(request_id)

    # ------------------------------------------------------------------
    # Output
    # ------------------------------------------------------------------

    def _put_unless_aborted(self, request_id: str, messages: Iterable[OutgoingMessage] | None) -> None:
        for out in messages or ():
            if not self.is_aborted(request_id):
                self.outbox.put(out)

    def emit_result(self, request_id: str, result: object) -> None:
        """Put a ``result`` for ``request_id`` into the outbox."""
        self.outbox.put(result_message(request_id, result))

    def emit_error(self, request_id: str, error: BaseException) -> None:
        """Put an ``error`` for ``request_id`` into the outbox."""
        self.outbox.put(error_message(request_id, error))
