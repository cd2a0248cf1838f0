"""The per-session order of a :class:`~omni_trio.scheduling.session.SessionScheduler`'s operations.

``open``/``append``/``close``/``control`` take a sequence number when they
enter the inbox (:class:`SessionInbox` registers them with the
:class:`SessionSequence` under one lock with the put) and run only after every
earlier operation of their session finished or was aborted. An append that
an earlier owner streams to also gets that stream here, through
:meth:`SessionSequence.take_upstream`. The sequence shares the scheduler's
condition: one lock guards the sessions and their order, and an operation
waits on it for its turn.
"""

from __future__ import annotations

import collections
import queue
import threading
from collections.abc import Iterator
from typing import Any, Final

import attrs

from omni_trio.scheduling.protocol import IncomingMessage
from omni_trio.scheduling.session_operation import SessionOp, SessionOperation

# In an append's upstream queue: the previous owner's append finished.
_UPSTREAM_DONE: Final = object()
# In an append's upstream queue: look at ``cancelled`` again.
_UPSTREAM_WAKE: Final = object()


@attrs.define(eq=False)
class SequencedOperation:
    """One sequenced operation, from entering the inbox until it finished."""

    request_id: str
    session_id: str
    op: SessionOp
    message: IncomingMessage | None = None
    started: bool = False
    cancelled: threading.Event = attrs.field(factory=threading.Event)


class SessionSequence:
    """The sequenced operations of every session, in order, and the upstream chunks of their appends.

    Methods named ``*_locked`` expect the caller to hold ``cond`` (the scheduler's condition, which
    this object shares); the others take it themselves.
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self._operations: dict[str, SequencedOperation] = {}
        self._order: dict[str, collections.deque[str]] = {}
        self._upstream: dict[str, queue.SimpleQueue[Any]] = {}

    def register(self, msg: IncomingMessage) -> None:
        """Number ``msg`` if it is a sequenced session operation (anything else passes untouched)."""
        if msg.type != "new_request":
            return
        try:
            operation = SessionOperation.from_payload(msg.data)
        except Exception:  # noqa: BLE001 - compute parses it again and fails the request
            # put() runs on the stage's event loop, where raising would fail the put itself.
            return
        if operation is None or operation.op == "read":
            return
        with self.cond:
            record = SequencedOperation(msg.request_id, operation.session_id, operation.op, message=msg)
            self._operations[msg.request_id] = record
            order = self._order.setdefault(operation.session_id, collections.deque())
            order.append(msg.request_id)
            if operation.op == "control" and operation.preempt:
                # Preemption must act now: sequenced, it would wait for the very
                # appends it is meant to cut short.
                for earlier in order:
                    if self._operations[earlier].op == "append":
                        self.cancel_locked(self._operations[earlier])

    def get_locked(self, request_id: str) -> SequencedOperation | None:
        """The operation of ``request_id``, if it is registered and not retired."""
        return self._operations.get(request_id)

    def has_turn_locked(self, record: SequencedOperation) -> bool:
        """Whether every earlier operation of ``record``'s session finished or was aborted."""
        return self._order[record.session_id][0] == record.request_id

    def has_operations_locked(self, session_id: str) -> bool:
        """Whether operations of ``session_id`` are registered and not retired (its open, maybe)."""
        return session_id in self._order

    def retire_locked(self, record: SequencedOperation) -> None:
        """Let the session's next operation go."""
        self._operations.pop(record.request_id, None)
        self._upstream.pop(record.request_id, None)
        order = self._order.get(record.session_id)
        if order is not None and record.request_id in order:
            order.remove(record.request_id)
            if not order:
                del self._order[record.session_id]
        self.cond.notify_all()

    def cancel_locked(self, record: SequencedOperation) -> None:
        """Cancel an operation and wake its upstream reader."""
        record.cancelled.set()
        box = self._upstream.get(record.request_id)
        if box is not None:
            box.put(_UPSTREAM_WAKE)

    def cancel_all_locked(self) -> None:
        """Cancel every registered operation (the scheduler stops)."""
        for record in self._operations.values():
            self.cancel_locked(record)

    def abort_locked(self, request_id: str) -> IncomingMessage | None:
        """Cancel ``request_id``'s operation; retire it if it has not started, so later ones need not
        wait. A close runs even when aborted: its message is returned, to be queued again (the stage
        may have purged it from the inbox)."""
        record = self._operations.get(request_id)
        if record is None:
            return None
        self.cancel_locked(record)
        if record.started:
            return None
        if record.op == "close":
            return record.message
        # "Finished or aborted": later operations need not wait for it.
        self.retire_locked(record)
        return None

    def take_upstream(self, msg: IncomingMessage) -> None:
        """A chunk (or the end) of what the previous owner streams for an append here."""
        with self.cond:
            record = self._operations.get(msg.request_id)
            if record is None or record.op != "append":
                return  # not an append (any more): nothing would read it
            box = self._upstream.setdefault(msg.request_id, queue.SimpleQueue())
        item = msg.data
        box.put(_UPSTREAM_DONE if msg.type == "stream_done" else getattr(item, "data", item))

    def read_upstream(self, record: SequencedOperation) -> Iterator[Any]:
        """The chunks streamed for ``record``'s append, until that stream ended or the append is cancelled."""
        with self.cond:
            box = self._upstream.setdefault(record.request_id, queue.SimpleQueue())
        while not record.cancelled.is_set():
            item = box.get()
            if item is _UPSTREAM_DONE:
                return
            if item is not _UPSTREAM_WAKE:
                yield item


class SessionInbox(queue.Queue[IncomingMessage]):
    """An inbox that numbers session operations as they are put.

    Registration and the put happen under one lock, so sequence order is
    queue order even with several putters; workers then always find the
    earliest operation of a session ahead of later ones.
    """

    def __init__(self, sequence: SessionSequence) -> None:
        super().__init__()
        self._sequence = sequence
        self._put_lock = threading.Lock()

    def put(self, item: IncomingMessage, block: bool = True, timeout: float | None = None) -> None:
        """Register ``item`` if it is a session operation, then queue it; stream input goes to its append."""
        if item.type in ("stream_chunk", "stream_done"):
            self._sequence.take_upstream(item)
            return
        with self._put_lock:
            self._sequence.register(item)
            super().put(item, block, timeout)

    def requeue(self, item: IncomingMessage) -> None:
        """Queue ``item`` again, registered already (a close an abort took out of the queue)."""
        with self.mutex:
            if any(queued is item for queued in self.queue):
                return
        super().put(item)
