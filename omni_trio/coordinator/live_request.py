"""One live request's record: what the coordinator keeps while it runs, and its stream reads."""

from __future__ import annotations

import collections
from typing import Any

import attrs
import outcome
import trio

from omni_trio.payload import OmniRequest
from omni_trio.scheduling.session_operation import SessionOperation

__all__ = ["END_OF_STREAM", "LiveRequest"]

#: The last event of a streaming request that succeeded (a failed one ends with its error).
END_OF_STREAM = object()


@attrs.define(eq=False)
class LiveRequest:
    """A request the coordinator admitted and has not resolved yet."""

    request_id: str
    request: OmniRequest
    expected: frozenset[str]
    streaming: bool
    done: trio.Event = attrs.field(factory=trio.Event)
    result: outcome.Outcome[Any] | None = None
    partial: dict[str, Any] = attrs.field(factory=dict)
    deadline_scope: trio.CancelScope | None = None
    events: Any = None  # send side of the streaming caller's channel
    received: Any = None  # its receive side
    session: SessionOperation | None = None
    entry_stages: tuple[str, ...] = ()  # where the Submit goes (several for a session's open/close/control)
    sent: bool = False  # began sending its Submit: stages may hold it (until then it is in none)
    # What its stream's queued events weigh (coordinator/stream_backlog.py): each event's bytes in queue order,
    # their sum, and when its reader last took one (a count of takes, not a time).
    backlog_sizes: collections.deque[int] = attrs.field(factory=collections.deque)
    backlog_bytes: int = 0
    last_take: int = 0
