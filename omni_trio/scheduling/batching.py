"""ContinuousBatchingScheduler: iteration-level batching for autoregressive stages.

A talker or any decoder makes one step of output for every request in its
batch at once; requests join between steps and leave when their last step
is done, so a new request never waits for a whole batch to finish (the
"continuous batching" of LLM servers). The user writes the step over the
batch; this module owns the loop, the joins, the aborts and the messages.

Two kinds of stage:

- payload-driven (``stream_input=False``): a request joins on its payload and
  is stepped every iteration until its step says it is done;
- stream-consuming (``stream_input=True``): a request joins on its first
  message, payload or upstream chunk, collects the chunks that arrive in
  :attr:`BatchedRequest.inputs`, and is stepped when it has new chunks, or,
  once its upstream stream ended and its payload is here, every iteration
  until it is done.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from omni_trio.payload import StagePayload, StreamItem
from omni_trio.scheduling._support import (
    WAKEUP,
    RunningComputes,
    SyncIdSet,
    ThreadLoop,
    call_logged,
    call_sync_or_async,
    error_message,
    result_message,
)
from omni_trio.scheduling.busy import BusyTime
from omni_trio.scheduling.idset import BoundedIdSet
from omni_trio.scheduling.inbox import Inbox
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage

logger = logging.getLogger(__name__)


@attrs.define(eq=False)
class BatchedRequest:
    """A request in a :class:`ContinuousBatchingScheduler`, as its hooks and step function see it.

    ``payload`` is None until it arrives (a stream-consuming request can join
    on its first chunk). ``state`` is what ``join_fn`` returned (the step may
    replace it). ``inputs`` holds the upstream chunks that arrived since the
    request's previous step, oldest first; the scheduler empties it after
    each step the request took part in. ``stream_ended`` says the upstream
    stream ended.
    """

    request_id: str
    payload: StagePayload | None = None
    state: Any = None
    inputs: list[StreamItem] = attrs.Factory(list)
    stream_ended: bool = False


@attrs.frozen
class StepOutput:
    """What one step made for one request.

    ``chunk`` (unless None) is streamed, with ``metadata``, to the stage's
    ``stream_to`` stages (to the caller from a terminal stage). ``done`` ends
    the request after this step: ``result`` (None: the request's payload, as
    the step left it) goes to the next stages, or to the caller.
    """

    chunk: Any = None
    metadata: dict[str, Any] | None = None
    done: bool = False
    result: Any = None


#: ``step_fn(batch)``: one entry per request of ``batch``, in order: a :class:`StepOutput`, a list of them
#: (several chunks in one step; only the last may be ``done``), or an exception (fails that request only).
StepFn = Callable[[list[BatchedRequest]], Sequence[Any]]
#: ``join_fn(request)``: the request's state (its prefill); raising fails the request.
JoinFn = Callable[[BatchedRequest], Any]
#: ``leave_fn(request)``: the request left the batch (done, failed, aborted or the stage stopped).
LeaveFn = Callable[[BatchedRequest], object]


class ContinuousBatchingScheduler:
    """Runs ``step_fn`` over the batch of active requests, one iteration at a time.

    Between two steps, requests whose payload (or, with ``stream_input``,
    first chunk) arrived join the batch in arrival order, up to
    ``max_batch_size``; ``join_fn`` (if given) makes each one's state. Every
    step's outputs are streamed on at once; a request whose output is
    ``done`` leaves (``leave_fn``) and its result is routed as any
    scheduler's. An aborted request leaves before the next step and the step
    never sees it again. An exception from ``step_fn`` fails every request
    of that step (the caller's ``RequestFailed`` names the stage and carries
    the message) and the scheduler goes on serving.

    With nothing to step the thread blocks on its inbox: no polling. A
    ``step_fn``/``join_fn`` may be ``async def`` (run on the thread's own
    event loop). Subclass it to override :meth:`warm_up_serving_thread`.
    """

    def __init__(
        self,
        step_fn: StepFn,
        *,
        max_batch_size: int = 8,
        join_fn: JoinFn | None = None,
        leave_fn: LeaveFn | None = None,
        stream_input: bool = False,
    ) -> None:
        if not callable(step_fn):
            raise ValueError(f"step_fn must be callable, got {step_fn!r}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a whole number >= 1, got {max_batch_size!r}")
        for name, hook in (("join_fn", join_fn), ("leave_fn", leave_fn)):
            if hook is not None and not callable(hook):
                raise ValueError(f"{name} must be callable or None, got {hook!r}")
        if not isinstance(stream_input, bool):
            raise ValueError(f"stream_input must be True or False, got {stream_input!r}")
        self.step_fn = step_fn
        self.max_batch_size = max_batch_size
        self.join_fn = join_fn
        self.leave_fn = leave_fn
        self.stream_input = stream_input
        self.inbox: queue.Queue[IncomingMessage] = Inbox()
        self.outbox = Outbox()
        #: How long steps and joins ran here (``stats()``'s ``busy_seconds``).
        self.busy = BusyTime()
        self._computes = RunningComputes()
        self._aborted = SyncIdSet()
        self._stopping = threading.Event()
        # Serving thread only, from here on.
        self._joined: dict[str, BatchedRequest] = {}
        self._waiting: collections.OrderedDict[str, BatchedRequest] = collections.OrderedDict()
        self._finished = BoundedIdSet()  # completed or failed here: their late messages are ignored

    # ------------------------------------------------------------------ the scheduler contract

    def warm_up_serving_thread(self) -> None:
        """Build thread-local state on the scheduler thread before serving (nothing by default)."""

    def start(self) -> None:
        """Serve until :meth:`stop`; blocks the calling (scheduler) thread."""
        loop = ThreadLoop()
        try:
            while not self._stopping.is_set():
                self._take_queued()
                self._admit(loop)
                batch = self._batch()
                if batch:
                    self._step(batch, loop)
                elif not self._stopping.is_set():
                    self._handle(self.inbox.get())  # nothing to step: block until a message comes
        finally:
            for request in list(self._joined.values()):
                self._leave(request)
            self._waiting.clear()
            loop.close()

    def stop(self) -> None:
        """Make :meth:`start` return after the step under way (from any thread; repeatable)."""
        self._stopping.set()
        self.inbox.put(WAKEUP)

    def abort(self, request_id: str) -> None:
        """Drop ``request_id``: it leaves before the next step and its outputs are dropped (quick, any thread)."""
        if self._aborted.add(request_id):
            # Wakes a loop blocked on the inbox, so leave_fn frees the request's slot now.
            self.inbox.put(IncomingMessage(request_id, "abort"))

    def is_aborted(self, request_id: str) -> bool:
        """Whether ``request_id`` was aborted here (remembered in a bounded set)."""
        return request_id in self._aborted

    def running_computes(self) -> dict[str, float]:
        """``request_id -> time.monotonic()`` at which the step (or join) computing it started."""
        return self._computes.snapshot()

    # ------------------------------------------------------------------ messages

    def _take_queued(self) -> None:
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    def _handle(self, msg: IncomingMessage) -> None:
        request_id = msg.request_id
        if msg.type == "abort":
            self._drop(request_id)
            return
        if msg.type not in ("new_request", "stream_chunk", "stream_done"):
            return  # the stop sentinel (the loop checks _stopping), admin notes
        if self.is_aborted(request_id):
            return
        if request_id in self._finished:
            if self.stream_input or msg.type != "new_request":
                return  # a late message of a request that finished here
            self._finished.discard(request_id)  # the id comes back, as a new request
        if msg.type != "new_request" and not self.stream_input:
            self._fail(request_id, ValueError(
                f"{msg.type} for {request_id!r}: this ContinuousBatchingScheduler takes no stream input "
                "(set stream_input=True)"))
            return
        request = self._joined.get(request_id) or self._waiting.get(request_id)
        if request is None:
            request = self._waiting[request_id] = BatchedRequest(request_id)
        if msg.type == "new_request":
            request.payload = msg.data
        elif msg.type == "stream_done":
            request.stream_ended = True
        elif isinstance(msg.data, StreamItem):
            request.inputs.append(msg.data)
        else:
            error = TypeError(f"expected a StreamItem for {request_id!r}, got {type(msg.data).__name__}")
            self._fail(request_id, error)

    # ------------------------------------------------------------------ joining, stepping, leaving

    def _admit(self, loop: ThreadLoop) -> None:
        """Waiting requests join, oldest first, while the batch has room."""
        while self._waiting and len(self._joined) < self.max_batch_size:
            _, request = self._waiting.popitem(last=False)
            if self.is_aborted(request.request_id):
                continue
            if self.join_fn is not None:
                self._computes.start((request.request_id,))
                try:
                    request.state = self.busy.call(call_sync_or_async, self.join_fn, request, loop=loop)
                except Exception as exc:
                    logger.exception("%s: join_fn failed for %s", type(self).__name__, request.request_id)
                    self._fail(request.request_id, exc)
                    continue
                finally:
                    self._computes.finish((request.request_id,))
            self._joined[request.request_id] = request

    def _batch(self) -> list[BatchedRequest]:
        """The joined requests that take part in the next step (aborted ones leave first)."""
        batch = []
        for request in list(self._joined.values()):
            if self.is_aborted(request.request_id):
                self._drop(request.request_id)
            elif not self.stream_input or request.inputs or (request.stream_ended and request.payload is not None):
                batch.append(request)
        return batch

    def _step(self, batch: list[BatchedRequest], loop: ThreadLoop) -> None:
        ids = [request.request_id for request in batch]
        self._computes.start(ids)
        try:
            outputs = self.busy.call(call_sync_or_async, self.step_fn, batch, loop=loop)
            if not isinstance(outputs, Sequence) or len(outputs) != len(batch):
                count = len(outputs) if isinstance(outputs, Sequence) else type(outputs).__name__
                raise ValueError(f"step_fn returned {count} outputs for {len(batch)} requests")
        except Exception as exc:
            logger.exception("%s: step of %d failed", type(self).__name__, len(batch))
            for request_id in ids:
                self._fail(request_id, exc)
            return
        finally:
            self._computes.finish(ids)
        for request, output in zip(batch, outputs, strict=True):
            request.inputs.clear()
            if self.is_aborted(request.request_id):
                self._drop(request.request_id)
            elif isinstance(output, BaseException):
                self._fail(request.request_id, output)
            else:
                self._emit(request, output)

    def _emit(self, request: BatchedRequest, output: object) -> None:
        """Stream one request's outputs of a step, and finish it if the last one is done."""
        try:
            outputs = _step_outputs(output)
            last = outputs[-1] if outputs else None
            if last is not None and last.done and last.result is None and request.payload is None:
                raise ValueError("it is done before its payload arrived (give StepOutput.result)")
        except ValueError as exc:
            self._fail(request.request_id, ValueError(f"step_fn's output for {request.request_id!r}: {exc}"))
            return
        for out in outputs:
            if out.chunk is not None:
                self.outbox.put(OutgoingMessage(request.request_id, "stream", data=out.chunk, metadata=out.metadata))
        if last is not None and last.done:
            self._leave(request)
            self._finished.add(request.request_id)
            self.outbox.put(result_message(request.request_id, request.payload if last.result is None else last.result))

    def _leave(self, request: BatchedRequest) -> None:
        """``request`` leaves the batch: its slot is free and ``leave_fn`` runs (its errors are logged)."""
        if self._joined.pop(request.request_id, None) is not None:
            call_logged(self.leave_fn, request, what=f"leave_fn for {request.request_id!r}")

    def _drop(self, request_id: str) -> None:
        """An aborted or failed request leaves, joined or waiting."""
        self._waiting.pop(request_id, None)
        request = self._joined.get(request_id)
        if request is not None:
            self._leave(request)

    def _fail(self, request_id: str, error: BaseException) -> None:
        self._drop(request_id)
        self._finished.add(request_id)
        if not self.is_aborted(request_id):
            self.outbox.put(error_message(request_id, error))


def _step_outputs(output: object) -> list[StepOutput]:
    """One request's outputs of a step as a list; ValueError says what is wrong with them."""
    outputs: list[StepOutput] = []
    for out in output if isinstance(output, list | tuple) else [output]:
        if not isinstance(out, StepOutput):
            raise ValueError(f"expected a StepOutput, a list of them or an exception, got {type(out).__name__}")
        if outputs and outputs[-1].done:
            raise ValueError("only the last StepOutput of a step may be done")
        outputs.append(out)
    return outputs
