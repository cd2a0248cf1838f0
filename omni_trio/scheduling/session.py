"""SessionScheduler: long-lived per-session state behind a SimpleScheduler.

A *session* is one long-lived connection whose state (encoder caches, codec
state, ...) outlives the short requests that feed it. Each request names its
operation in ``request.metadata["omni_session"]``::

    {"op": "open" | "append" | "close" | "control" | "read",
     "session_id": "s1",
     "stages": ["asr", ...],           # the session's owner stages, in pipeline order
     "chunk": ...,                     # append: the input chunk (default: the request's inputs)
     "preempt": True,                  # control: cancel this session's earlier appends
     "preempted_request_ids": [...]}   # requests to abort before this one runs

``stages`` and ``preempted_request_ids`` are for the coordinator and the
stage (which routes and aborts by them); the scheduler only parses them. An
append that an earlier owner streams to reads that owner's chunks through
``SessionContext.upstream()``. ``open``/``append``/``close``/``control``
take a per-session sequence number when they enter the inbox and run only
after every earlier operation of their session finished or was aborted;
operations of different sessions run concurrently on the worker threads.
``read`` is not sequenced: it attaches the request as the session's output
reader, which receives the chunks appends emit and is answered at close.
Requests without the metadata go to ``compute_fn``.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import attrs

from omni_trio.payload import StagePayload
from omni_trio.scheduling._support import checked_count, error_message, result_message
from omni_trio.scheduling.errors import QUEUE_FULL_TEXT, QueueFullError
from omni_trio.scheduling.protocol import IncomingMessage, OutgoingMessage
from omni_trio.scheduling.session_hooks import SessionContext, SessionHooks, TimedChunk
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.scheduling.session_sequence import SequencedOperation, SessionInbox, SessionSequence
from omni_trio.scheduling.simple import SimpleScheduler

logger = logging.getLogger(__name__)

DEFAULT_MAX_OPEN_SESSIONS = 64
DEFAULT_MAX_CONCURRENCY = 4
DEFAULT_MAX_STATE_BYTES_PER_SESSION = 1 << 30


@attrs.define(eq=False)
class _Session:
    session_id: str
    #: An operation of this session is running (stop leaves it to close the session).
    busy: bool = False


# compute's way of saying "nothing to emit now" (a read is answered at close).
_NO_OUTPUT: Final = object()


class SessionScheduler(SimpleScheduler):
    """A concurrent :class:`SimpleScheduler` that keeps per-session state.

    ``open`` fails with :class:`QueueFullError` when ``max_open_sessions``
    are open and with ``ValueError`` for a duplicate; a failed open or append
    closes the session; ``close`` answers ``{"closed": True}`` even for an
    unknown session and runs even if aborted, so state never leaks. ``stop``
    cancels running appends and closes every session once idle.
    """

    def __init__(
        self,
        session_hooks: SessionHooks,
        *,
        compute_fn: Callable[[StagePayload], Any] | None = None,
        max_open_sessions: int = DEFAULT_MAX_OPEN_SESSIONS,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_state_bytes_per_session: int = DEFAULT_MAX_STATE_BYTES_PER_SESSION,
    ) -> None:
        checked_count("max_open_sessions", max_open_sessions)
        checked_count("max_state_bytes_per_session", max_state_bytes_per_session)
        self.session_hooks = session_hooks
        self.request_compute_fn = compute_fn
        self.max_open_sessions = max_open_sessions
        self.max_state_bytes_per_session = max_state_bytes_per_session
        # One condition guards the tables below; operations wait on it for their turn.
        self._cond = threading.Condition()
        self._sequence = SessionSequence(self._cond)
        self._sessions: dict[str, _Session] = {}
        self._readers: dict[str, StagePayload] = {}
        self._sessions_stopping = False
        super().__init__(
            self._compute,
            max_concurrency=max_concurrency,
            abort_callback=self._on_abort,
            shutdown_callback=self._on_shutdown,
        )
        self.inbox = SessionInbox(self._sequence)

    def warm_up_serving_thread(self) -> None:
        """Run the hooks' ``warm_up_serving_thread`` if they have one."""
        warm_up = getattr(self.session_hooks, "warm_up_serving_thread", None)
        if warm_up is not None:
            warm_up()

    def open_session_ids(self) -> list[str]:
        """Ids of the sessions currently open here."""
        with self._cond:
            return list(self._sessions)

    # ------------------------------------------------------------------
    # Sequencing
    # ------------------------------------------------------------------

    def _begin(self, request_id: str) -> SequencedOperation | None:
        """Wait for the operation's turn; None if an abort retired it first."""
        with self._cond:
            while True:
                record = self._sequence.get_locked(request_id)
                if record is None:
                    return None
                if self._sessions_stopping:
                    self._sequence.retire_locked(record)
                    raise RuntimeError("session scheduler is stopping")
                if self._sequence.has_turn_locked(record):
                    record.started = True
                    session = self._sessions.get(record.session_id)
                    if session is not None:
                        session.busy = True
                    return record
                self._cond.wait()

    def _end(self, record: SequencedOperation) -> None:
        with self._cond:
            self._sequence.retire_locked(record)
            session = self._sessions.get(record.session_id)
            close_now = False
            if session is not None:
                session.busy = False
                close_now = self._sessions_stopping
        if close_now:
            # stop() found this session busy and left its closing to us.
            self._close_session(
                record.session_id, failure=RuntimeError("session scheduler stopped"), raise_errors=False
            )

    def _skip_before_compute(self, msg: IncomingMessage) -> bool:
        if not self.is_aborted(msg.request_id):
            return False
        with self._cond:
            record = self._sequence.get_locked(msg.request_id)
            if record is not None and record.op == "close":
                # A close runs even when aborted, or the session's state would leak;
                # its output is still dropped afterwards.
                return False
            if record is not None:
                self._sequence.retire_locked(record)
        return super()._skip_before_compute(msg)

    # ------------------------------------------------------------------
    # Operations
    # ------------------------------------------------------------------

    def _compute(self, payload: StagePayload) -> Any:
        operation = SessionOperation.from_payload(payload)
        if operation is None:
            if self.request_compute_fn is None:
                raise ValueError("this stage has no compute_fn for requests outside a session")
            return self.request_compute_fn(payload)
        if operation.op == "read":
            return self._attach_reader(operation, payload)
        record = self._begin(payload.request_id)
        if record is None:
            return _NO_OUTPUT
        try:
            if operation.op == "open":
                return self._open(operation, payload)
            if operation.op == "append":
                return self._append(operation, payload, record)
            if operation.op == "close":
                self._close_session(operation.session_id, failure=None, raise_errors=True)
                payload.data = {"closed": True}
                return payload
            return self._control(operation, payload)
        finally:
            self._end(record)

    def _open(self, operation: SessionOperation, payload: StagePayload) -> StagePayload:
        session_id = operation.session_id
        with self._cond:
            if session_id in self._sessions:
                raise ValueError(f"session {session_id!r} is already open")
            if len(self._sessions) >= self.max_open_sessions:
                raise QueueFullError(
                    f"{QUEUE_FULL_TEXT} Cannot open session {session_id!r}: "
                    f"{self.max_open_sessions} sessions are already open"
                )
            self._sessions[session_id] = _Session(session_id, busy=True)
        try:
            self.session_hooks.open(session_id, payload.request)
            self._check_budget(session_id)
        except BaseException as exc:
            self._close_session(session_id, failure=exc, raise_errors=False)
            raise
        payload.data = {"opened": True}
        return payload

    def _append(self, operation: SessionOperation, payload: StagePayload, record: SequencedOperation) -> Any:
        session_id = operation.session_id
        with self._cond:
            if session_id not in self._sessions:
                raise ValueError(f"session {session_id!r} is not open")
        context = SessionContext(
            session_id=session_id,
            request_id=payload.request_id,
            cancelled=record.cancelled,
            emit=functools.partial(self._emit_chunk, session_id, payload.request_id, record.cancelled),
            upstream=functools.partial(self._sequence.read_upstream, record),
        )
        chunk = operation.chunk if operation.has_chunk else payload.request.inputs
        try:
            result = self.session_hooks.append(chunk, payload, context)
            self._check_budget(session_id)
        except BaseException as exc:
            self._close_session(session_id, failure=exc, raise_errors=False)
            raise
        return result

    def _control(self, operation: SessionOperation, payload: StagePayload) -> StagePayload:
        with self._cond:
            if operation.session_id not in self._sessions:
                raise ValueError(f"session {operation.session_id!r} is not open")
        control = getattr(self.session_hooks, "control", None)
        if control is not None:
            control(operation.session_id, payload)
        payload.data = {"controlled": True}
        return payload

    def _attach_reader(self, operation: SessionOperation, payload: StagePayload) -> object:
        session_id = operation.session_id
        with self._cond:
            if self._sessions_stopping:
                raise RuntimeError("session scheduler is stopping")
            if session_id in self._readers:
                raise ValueError(f"session {session_id!r} already has a reader")
            if session_id not in self._sessions and not self._sequence.has_operations_locked(session_id):
                raise ValueError(f"session {session_id!r} is not open")
            # Checked under the lock that _on_abort takes: an abort either
            # lands before (no attach) or detaches right after.
            if not self.is_aborted(payload.request_id):
                self._readers[session_id] = payload
        return _NO_OUTPUT

    def _check_budget(self, session_id: str) -> None:
        state_bytes = getattr(self.session_hooks, "state_bytes", None)
        if state_bytes is None:
            return
        used = int(state_bytes(session_id))
        if used > self.max_state_bytes_per_session:
            raise QueueFullError(
                f"{QUEUE_FULL_TEXT} Session {session_id!r} holds {used} bytes of state, "
                f"over its budget of {self.max_state_bytes_per_session}"
            )

    def _emit_chunk(
        self,
        session_id: str,
        request_id: str,
        cancelled: threading.Event,
        chunk: TimedChunk | Mapping[str, Any],
    ) -> None:
        data = chunk.to_dict() if isinstance(chunk, TimedChunk) else dict(chunk)
        if cancelled.is_set():
            return
        with self._cond:
            reader = self._readers.get(session_id)
        target = reader.request_id if reader is not None else request_id
        modality = data.get("modality")
        self.outbox.put(
            OutgoingMessage(
                request_id=target,
                type="stream",
                data=data,
                metadata=None if modality is None else {"modality": modality},
            )
        )

    def _close_session(self, session_id: str, *, failure: BaseException | None, raise_errors: bool) -> None:
        """Release a session (if open here) and answer its reader (if any)."""
        with self._cond:
            session = self._sessions.pop(session_id, None)
            reader = self._readers.pop(session_id, None)
        close_error: Exception | None = None
        if session is not None:
            try:
                self.session_hooks.close(session_id)
            except Exception as exc:
                logger.exception("SessionScheduler: closing session %r failed", session_id)
                close_error = exc
        if reader is not None:
            error = failure if failure is not None else close_error
            if error is None:
                reader.data = {"closed": True}
                self.outbox.put(result_message(reader.request_id, reader))
            else:
                self.outbox.put(error_message(reader.request_id, error))
        if close_error is not None and raise_errors:
            raise close_error

    # ------------------------------------------------------------------
    # Abort, stop, output
    # ------------------------------------------------------------------

    def _on_abort(self, request_id: str) -> None:
        with self._cond:
            requeue = self._sequence.abort_locked(request_id)
            for session_id, reader in list(self._readers.items()):
                if reader.request_id == request_id:
                    del self._readers[session_id]
        if requeue is not None:
            cast(SessionInbox, self.inbox).requeue(requeue)

    def _on_shutdown(self) -> None:
        with self._cond:
            self._sessions_stopping = True
            self._sequence.cancel_all_locked()
            idle = [sid for sid, session in self._sessions.items() if not session.busy]
            orphan_readers = [sid for sid in self._readers if sid not in self._sessions]
            self._cond.notify_all()
        for session_id in idle + orphan_readers:
            self._close_session(session_id, failure=RuntimeError("session scheduler stopped"), raise_errors=False)

    def _emit_result(self, request_id: str, result: object) -> None:
        if result is not _NO_OUTPUT:
            super()._emit_result(request_id, result)
