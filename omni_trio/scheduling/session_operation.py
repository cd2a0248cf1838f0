"""The session operation a request names in its ``omni_session`` metadata, parsed.

The coordinator, the stage and the :class:`~omni_trio.scheduling.session.SessionScheduler` all read
it: the coordinator and the stage route and abort by its ``stages`` and ``preempted_request_ids``,
the scheduler runs its ``op``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, cast, get_args

import attrs

from omni_trio.payload import SESSION_METADATA_KEY, OmniRequest

__all__ = ["SESSION_OPS", "SessionOp", "SessionOperation"]

SessionOp = Literal["open", "append", "close", "control", "read"]
SESSION_OPS: Final[frozenset[str]] = frozenset(get_args(SessionOp))


@attrs.frozen
class SessionOperation:
    """A request's parsed ``omni_session`` metadata."""

    op: SessionOp
    session_id: str
    chunk: Any = None
    has_chunk: bool = False
    preempt: bool = False
    stages: tuple[str, ...] = ()
    preempted_request_ids: tuple[str, ...] = ()

    @classmethod
    def from_payload(cls, payload: object) -> SessionOperation | None:
        """Parse ``payload.request.metadata``; None for a request outside any session."""
        request = getattr(payload, "request", None)
        if not isinstance(request, OmniRequest):
            return None
        return cls.from_request(request)

    @classmethod
    def from_request(cls, request: OmniRequest) -> SessionOperation | None:
        """Parse ``request.metadata``; None outside any session, ``ValueError`` when malformed."""
        raw = request.metadata.get(SESSION_METADATA_KEY)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ValueError(f"{SESSION_METADATA_KEY!r} metadata must be a mapping, got {type(raw).__name__}")
        op = raw.get("op")
        if op not in SESSION_OPS:
            raise ValueError(f"unknown session operation {op!r}; expected one of {sorted(SESSION_OPS)}")
        session_id = raw.get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session operation {op!r} needs a non-empty string session_id")
        return cls(
            op=cast(SessionOp, op),
            session_id=session_id,
            chunk=raw.get("chunk"),
            has_chunk="chunk" in raw,
            preempt=bool(raw.get("preempt", False)),
            stages=_names(raw.get("stages", ()), "stages"),
            preempted_request_ids=_names(raw.get("preempted_request_ids", ()), "preempted_request_ids"),
        )


def _names(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"session metadata {key!r} must be a list of names, got {type(value).__name__}")
    if not all(isinstance(name, str) and name for name in value):
        raise ValueError(f"session metadata {key!r} must hold non-empty strings, got {list(value)!r}")
    return tuple(value)
