"""What a session's stage code implements and gets: :class:`SessionHooks`, :class:`SessionContext`,
:class:`TimedChunk` (the :class:`~omni_trio.scheduling.session.SessionScheduler` calls the hooks)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import attrs

from omni_trio.payload import OmniRequest, StagePayload

__all__ = ["ChunkEmitter", "SessionContext", "SessionHooks", "TimedChunk"]


@attrs.frozen
class TimedChunk:
    """One piece of session output, with its place on the session's timeline."""

    data: Any
    start_ms: float | None = None
    end_ms: float | None = None
    modality: str = "text"

    def to_dict(self) -> dict[str, Any]:
        """The dict form that travels as a ``stream`` message's data."""
        return attrs.asdict(self, recurse=False)


#: ``emit(chunk)``: stream one output chunk (a TimedChunk or its dict form).
ChunkEmitter = Callable[[TimedChunk | Mapping[str, Any]], None]


@attrs.frozen
class SessionContext:
    """What an ``append`` hook gets besides its input.

    ``cancelled`` is set when the append is aborted, preempted by a
    ``control`` with ``preempt``, or the scheduler stops: the hook should
    stop work and return. ``emit`` streams output; it drops chunks once
    ``cancelled`` is set. ``upstream()`` iterates over the chunks the
    previous owner in ``stages`` streams for this append (their data), until
    that owner's append finished; it ends early when ``cancelled`` is set.
    """

    session_id: str
    request_id: str
    cancelled: threading.Event
    emit: ChunkEmitter
    upstream: Callable[[], Iterator[Any]] = attrs.field(default=lambda: iter(()))


class SessionHooks(Protocol):
    """A stage's per-session callbacks.

    Hooks of one session run one at a time, in arrival order; different
    sessions may run concurrently. Optional extra members, found by name:
    ``state_bytes(session_id) -> int`` (state held, checked against
    ``max_state_bytes_per_session`` after open and every append),
    ``control(session_id, payload) -> None`` and
    ``warm_up_serving_thread() -> None``.
    """

    def open(self, session_id: str, request: OmniRequest) -> None:
        """Create the session's state; on error release whatever was allocated."""
        ...

    def append(self, chunk: Any, payload: StagePayload, context: SessionContext) -> Any:
        """Feed one chunk; return the request's result (normally ``payload``)."""
        ...

    def close(self, session_id: str) -> None:
        """Release the session's state; must be idempotent."""
        ...
