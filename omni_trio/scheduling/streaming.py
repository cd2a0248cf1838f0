"""StreamingSimpleScheduler: a base for stages that consume upstream streams.

Vocoders and streaming detokenisers receive ``stream_chunk`` messages (one
``StreamItem`` each), a ``stream_done`` that routinely lands *before* the
request's payload (the upstream sends done signals before routing its
result), and ``new_request`` payloads. Subclasses implement the hooks;
non-streaming payloads are computed like :class:`SimpleScheduler` does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from omni_trio.payload import StagePayload, StreamItem
from omni_trio.scheduling._support import (
    BatchWindow,
    ThreadLoop,
    batch_results,
    call_sync_or_async,
)
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage
from omni_trio.scheduling.streaming_core import StreamingCore

logger = logging.getLogger(__name__)


class StreamingSimpleScheduler(StreamingCore):
    """Scheduler base for simple stages with streaming input.

    Streaming requests (``is_streaming_payload`` is True) are set up with
    ``on_streaming_new_request``, fed with ``on_stream_chunk`` (chunks that
    arrive before the payload too: the subclass owns state for ids it has
    not seen a payload for) and completed by ``on_stream_done``. A done
    signal without a payload yet is remembered in :attr:`pending_done` and
    handled when the payload arrives; ``on_stream_done_before_payload``
    emits what is owed at once. Non-streaming requests go to ``compute_fn``
    / ``batch_compute_fn``.

    Class knobs: ``can_batch_stream_chunks`` hands already-queued consecutive
    chunks to ``on_stream_chunk_batch`` at once (up to
    ``stream_chunk_batch_max``, else ``max_batch_size``), and
    ``stream_chunk_batch_distinct_requests`` ends such a batch at the first
    repeated request id.

    ``max_pending`` bounds the new requests waiting in the inbox (see
    :meth:`enqueue`); stream chunks and signals are never refused.

    A request id may serve again once its request completed here: nothing of
    the finished request is kept but, when it completed before its
    ``stream_done`` came, one mark that ignores that late done
    (:attr:`completed_request_ids`). A chunk under a completed id starts the
    new request (a chunk never follows its own stream's done). An aborted id
    stays aborted: what still comes for it is skipped.
    """

    def on_stream_chunk_batch(self, items: list[tuple[str, StreamItem]]) -> None:
        """Handle several queued chunks; called without the lock, return ignored.

        The default feeds them one by one to :meth:`on_stream_chunk`; an error
        fails and aborts only that chunk's request. Overrides own their
        locking and put their output into :attr:`outbox` themselves.
        """
        for request_id, item in items:
            if self.is_aborted(request_id):
                continue
            try:
                self.handle_stream_chunk(request_id, item)
            except Exception as exc:
                logger.exception("%s: stream chunk failed for %s", type(self).__name__, request_id)
                self.emit_error(request_id, exc)
                self.abort(request_id)

    # ------------------------------------------------------------------
    # Serving
    # ------------------------------------------------------------------

    def start(self) -> None:
        """Serve until :meth:`stop`; blocks the calling (scheduler) thread."""
        loop = ThreadLoop()
        self._serving_thread = threading.get_ident()
        try:
            while not self._stopping.is_set():
                if self.has_ready_work():
                    # Ingest whatever is queued before stepping, so the step
                    # sees the freshest state; step only when nothing is queued.
                    msg = self._take_nowait()
                    if msg is None:
                        self.busy.call(self.run_ready_step)
                        continue
                else:
                    msg = self._take()
                if self._absorb_abort(msg) or msg.type == "wakeup" or self.is_aborted(msg.request_id):
                    continue
                try:
                    self.handle_message(msg, loop)
                except Exception as exc:
                    logger.exception("%s failed for %s", type(self).__name__, msg.request_id)
                    self.emit_error(msg.request_id, exc)
                    self.abort(msg.request_id)
        finally:
            loop.close()

    def handle_message(self, msg: IncomingMessage, loop: ThreadLoop) -> None:
        """Handle one message from the inbox (exceptions fail its request)."""
        ids = (msg.request_id,)
        self._computes.start(ids)
        try:
            if msg.type == "new_request":
                self.handle_new_request(msg, loop)
            elif msg.type == "stream_chunk":
                if self.can_batch_stream_chunks:
                    self.handle_stream_chunk_batch(self.collect_stream_chunk_batch(msg))
                else:
                    self.handle_stream_chunk(msg.request_id, msg.data)
            elif msg.type == "stream_done":
                self.handle_stream_done(msg.request_id)
            else:
                raise ValueError(f"unsupported streaming scheduler message type: {msg.type!r}")
        finally:
            self._computes.finish(ids)

    # ------------------------------------------------------------------
    # new_request
    # ------------------------------------------------------------------

    def handle_new_request(self, msg: IncomingMessage, loop: ThreadLoop) -> None:
        """Set up a streaming request, or compute a (batch of) non-streaming one(s)."""
        if self.is_streaming_payload(msg.data):
            self.handle_streaming_new_request(msg.request_id, msg.data)
            return
        self.run_non_streaming_batch(self.collect_new_request_batch(msg), loop)

    def collect_new_request_batch(self, first: IncomingMessage) -> list[IncomingMessage]:
        """Gather non-streaming requests that can join ``first``'s batch.

        ``first`` is known not to be streaming. Messages are taken from
        ``pending_messages`` first, then the inbox; the window is armed as in
        :meth:`SimpleScheduler.collect_batch` (at ``first`` only with
        ``batch_wait_when_idle``). A ``stream_done`` for a request without a
        stream payload is set aside and the search goes on; any other message,
        a streaming payload or a cost overflow is set aside and ends it. Set
        aside messages go back to the front of ``pending_messages`` in
        arrival order.
        """
        batch = [first]
        if self.batch_compute_fn is None or self.max_batch_size <= 1:
            return batch
        deferred: list[IncomingMessage] = []
        cost = self.message_cost(first) if self.max_batch_cost is not None else 0
        window = BatchWindow(self.max_batch_wait_s, armed_at_first=self.batch_wait_when_idle)
        while len(batch) < self.max_batch_size:
            msg = window.next_message(self._take_nowait, self.inbox)
            if msg is None:
                break
            if msg.type == "wakeup":
                deferred.append(msg)
                break
            if self._absorb_abort(msg) or self.is_aborted(msg.request_id):
                continue
            if msg.type != "new_request":
                deferred.append(msg)
                if msg.type == "stream_done" and msg.request_id not in self.stream_payloads:
                    # Done-before-payload only latches state; keep looking.
                    continue
                break
            try:
                streaming = self.is_streaming_payload(msg.data)
                msg_cost = self.message_cost(msg) if self.max_batch_cost is not None else 0
            except Exception as exc:
                logger.exception("%s: admitting %s failed", type(self).__name__, msg.request_id)
                self.emit_error(msg.request_id, exc)
                self.abort(msg.request_id)
                continue
            if streaming:
                deferred.append(msg)
                break
            if self.max_batch_cost is not None:
                if cost + msg_cost > self.max_batch_cost:
                    deferred.append(msg)
                    break
                cost += msg_cost
            batch.append(msg)
            window.joined()
        self.pending_messages.extendleft(reversed(deferred))
        return batch

    def handle_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        """Store a streaming payload; finish at once if its done already came."""
        self.aborted_request_ids.discard(request_id)
        with self.state_lock:
            self.completed_request_ids.discard(request_id)
            self.stream_payloads[request_id] = payload
            self.busy.call(self.on_streaming_new_request, request_id, payload)
            if request_id in self.pending_done:
                self.pending_done.discard(request_id)
                self.handle_stream_done(request_id)

    def run_non_streaming_batch(self, batch: list[IncomingMessage], loop: ThreadLoop) -> None:
        """Validate and compute non-streaming requests, singly or as one batch."""
        active = [msg for msg in batch if not self.is_aborted(msg.request_id)]
        with self.state_lock:
            for msg in active:
                if msg.request_id in self.pending_done:
                    self.pending_done.discard(msg.request_id)
                    self._stream_ended.add(msg.request_id)
        valid: list[IncomingMessage] = []
        for msg in active:
            try:
                self.validate_non_streaming_payload(msg.data)
            except Exception as exc:  # noqa: BLE001 - the error message carries it to the caller
                self._finish_non_streaming(msg.request_id, exc)
                continue
            valid.append(msg)
        if self.batch_compute_fn is None or len(valid) <= 1:
            for msg in valid:
                if self.is_aborted(msg.request_id):
                    continue
                try:
                    result = self.run_compute(msg.data, loop)
                except Exception as exc:
                    logger.exception("%s: compute_fn failed for %s", type(self).__name__, msg.request_id)
                    result = exc
                self._finish_non_streaming(msg.request_id, result)
            return
        try:
            returned = self.busy.call(call_sync_or_async, self.batch_compute_fn, [msg.data for msg in valid], loop=loop)
            results = batch_results(returned, len(valid))
        except Exception as exc:
            logger.exception("%s: batch of %d failed", type(self).__name__, len(valid))
            for msg in valid:
                self._finish_non_streaming(msg.request_id, exc)
            return
        for msg, result in zip(valid, results, strict=True):
            self._finish_non_streaming(msg.request_id, result)

    def run_compute(self, payload: StagePayload, loop: ThreadLoop) -> Any:
        """Run ``compute_fn`` on one non-streaming payload."""
        if self.compute_fn is None:
            raise RuntimeError(f"{type(self).__name__} does not support non-streaming compute")
        return self.busy.call(call_sync_or_async, self.compute_fn, payload, loop=loop)

    def _finish_non_streaming(self, request_id: str, outcome: object) -> None:
        # An exception object as the outcome fails only this request.
        if self.is_aborted(request_id):
            return
        if isinstance(outcome, BaseException):
            self.emit_error(request_id, outcome)
        else:
            self.emit_result(request_id, outcome)
        self._completed(request_id)

    def _completed(self, request_id: str) -> None:
        """``request_id`` finished here: clear its state, and remember it if a done signal may still come.

        A ``stream_done`` ends a request's stream once: after one arrived, the next
        done under this id belongs to a new request that reuses the id. Until one
        arrived, the next done may be this request's own, late (its stream ended on
        another path than its payload came by), and is ignored once (see
        :meth:`handle_stream_done`). Nothing else of the request is kept, so the id can
        serve a new request with nothing of this one applied to it.
        """
        with self.state_lock:
            ended = request_id in self._stream_ended
            self.clear_request_state(request_id)
            if not ended:
                self.completed_request_ids.add(request_id)

    # ------------------------------------------------------------------
    # stream_chunk / stream_done
    # ------------------------------------------------------------------

    def collect_stream_chunk_batch(self, first: IncomingMessage) -> list[IncomingMessage]:
        """``first`` plus already-queued consecutive chunks (never waits)."""
        batch = [first]
        seen = {first.request_id} if self.stream_chunk_batch_distinct_requests else None
        cap = self.stream_chunk_batch_max or self.max_batch_size
        while len(batch) < cap:
            msg = self._take_nowait()
            if msg is None:
                break
            if self._absorb_abort(msg) or self.is_aborted(msg.request_id):
                continue
            if msg.type != "stream_chunk":
                self.pending_messages.appendleft(msg)
                break
            if seen is not None:
                if msg.request_id in seen:
                    self.pending_messages.appendleft(msg)
                    break
                seen.add(msg.request_id)
            batch.append(msg)
        return batch

    def validate_stream_chunk_item(self, request_id: str, item: object) -> StreamItem:
        """Check that a ``stream_chunk`` carries a :class:`StreamItem`."""
        if not isinstance(item, StreamItem):
            raise TypeError(
                f"{type(self).__name__} expected a StreamItem for {request_id!r}, got {type(item).__name__}"
            )
        return item

    def handle_stream_chunk(self, request_id: str, item: object) -> None:
        """Feed one chunk to :meth:`on_stream_chunk` and emit its messages."""
        chunk = self.validate_stream_chunk_item(request_id, item)
        with self.state_lock:
            # A chunk never follows its stream's done: under a completed id it starts a new request.
            self.completed_request_ids.discard(request_id)
            self._put_unless_aborted(request_id, self.busy.call(self.on_stream_chunk, request_id, chunk))

    def handle_stream_chunk_batch(self, batch: list[IncomingMessage]) -> None:
        """Validate a chunk batch and hand it to :meth:`on_stream_chunk_batch`."""
        items: list[tuple[str, StreamItem]] = []
        for msg in batch:
            if self.is_aborted(msg.request_id):
                continue
            # A chunk never follows its stream's done: under a completed id it starts a new request.
            self.completed_request_ids.discard(msg.request_id)
            try:
                items.append((msg.request_id, self.validate_stream_chunk_item(msg.request_id, msg.data)))
            except Exception as exc:  # noqa: BLE001 - the error message carries it to the caller
                self.emit_error(msg.request_id, exc)
                self.abort(msg.request_id)
        items = [(rid, item) for rid, item in items if not self.is_aborted(rid)]
        if not items:
            return
        if type(self).on_stream_chunk_batch is StreamingSimpleScheduler.on_stream_chunk_batch:
            self.on_stream_chunk_batch(items)  # the default times each on_stream_chunk itself
        else:
            self.busy.call(self.on_stream_chunk_batch, items)

    def handle_stream_done(self, request_id: str) -> None:
        """End of the request's stream: complete it, or latch it until the payload."""
        with self.state_lock:
            if request_id not in self.stream_payloads:
                if self.completed_request_ids.pop(request_id):
                    return  # the late done of the request that completed under this id (see _completed)
                self.pending_done.add(request_id)
                self._put_unless_aborted(request_id, self.busy.call(self.on_stream_done_before_payload, request_id))
                return
            self._stream_ended.add(request_id)
            messages = self.busy.call(self.on_stream_done, request_id)
            if messages is not None:
                self.complete_stream_request(request_id, messages)

    def complete_stream_request(self, request_id: str, messages: Iterable[OutgoingMessage]) -> None:
        """Emit a streaming request's final messages and clear its state.

        Called by the base for ``on_stream_done``'s list, or by a subclass
        that returned ``None`` there, once it has finished.
        """
        with self.state_lock:
            self._put_unless_aborted(request_id, messages)
            if not self.is_aborted(request_id):
                self._completed(request_id)
