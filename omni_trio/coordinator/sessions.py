"""Sessions as a trio-shaped object: ``async with pipeline.session(...) as s``.

A session's operations are ordinary requests whose metadata carries
``omni_session``; this module says where each one goes
(:func:`session_targets`) and wraps them in :class:`Session`::

    async with pipeline.session("s1", stages=["asr"]) as s:   # open
        await s.append(chunk)                                  # one append, its output into s.events()
        async for event in s.events(): ...                     # ends once the session is closed
    # leaving the block closes the session, even when the block was cancelled
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Collection
from typing import Any, Protocol

import trio

from omni_trio.coordinator.request_stream import RequestStream
from omni_trio.errors import SessionClosed
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.payload import SESSION_METADATA_KEY
from omni_trio.scheduling.session_operation import SessionOperation

#: How long closing a session may take; bounded because it runs shielded from cancellation.
CLOSE_DEADLINE_S = 30.0

SessionEvent = StreamMessage | CompleteMessage


def session_targets(
    operation: SessionOperation, stage_names: Collection[str], replicated: Collection[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(stages the request is submitted to, stages whose completion resolves it)``.

    Sessions cannot own a replicated stage (``replicas > 1``): replicas are bound per
    request, and a session's state lives in one scheduler across many requests.

    An append enters at the first owner and completes at the last; a read
    attaches at the last owner, whose output the caller sees; open, close and
    control run at every owner and complete at each.
    """
    stages = operation.stages
    if not stages:
        raise ValueError(f"session operation {operation.op!r} needs 'stages': the session's owner stages")
    unknown = [name for name in stages if name not in stage_names]
    if unknown:
        raise ValueError(f"session stages {unknown!r} are not stages of this pipeline ({sorted(stage_names)})")
    if len(set(stages)) != len(stages):
        raise ValueError(f"session stages list a stage twice: {list(stages)!r}")
    if on_replicas := [name for name in stages if name in replicated]:
        raise ValueError(
            f"session stages {on_replicas!r} have replicas; a session's state lives in one scheduler, "
            "so session owners must run with replicas=1"
        )
    if operation.op == "append":
        return (stages[0],), (stages[-1],)
    if operation.op == "read":
        return (stages[-1],), (stages[-1],)
    return stages, stages


class SessionRequests(Protocol):
    """What a session needs of its pipeline (the coordinator): running its operations as requests."""

    async def submit(
        self, request_id: str, inputs: Any, *, metadata: dict[str, Any] | None = None, deadline: float | None = None
    ) -> Any:
        """Run one request to completion and return its result."""

    def stream(self, request_id: str, inputs: Any, *, metadata: dict[str, Any] | None = None) -> RequestStream:
        """Run one request and iterate over its stream chunks and completions."""


class Session:
    """One open session of a pipeline (see the module docstring).

    Every append is streamed: its :class:`StreamMessage` chunks and its
    :class:`CompleteMessage` go, in order, into :meth:`events`, and
    :meth:`append` returns its result. Request ids are
    ``<session_id>/<token>/<op>/<n>``, unique per ``Session`` object.
    """

    def __init__(self, pipeline: SessionRequests, session_id: str, stages: list[str]) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session ids are non-empty strings, got {session_id!r}")
        self.session_id = session_id
        self.stages = list(stages)
        self._pipeline = pipeline
        self._token = uuid.uuid4().hex[:8]
        self._numbers = itertools.count()
        self._send, self._receive = trio.open_memory_channel[SessionEvent](math.inf)
        self._closed = False

    def request_id(self, op: str) -> str:
        """A fresh request id for one operation of this session."""
        return f"{self.session_id}/{self._token}/{op}/{next(self._numbers)}"

    def _metadata(self, op: str, **extra: Any) -> dict[str, Any]:
        return {SESSION_METADATA_KEY: {"op": op, "session_id": self.session_id, "stages": self.stages, **extra}}

    async def __aenter__(self) -> Session:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def open(self) -> Any:
        """Open the session at every owner stage (``QueueFullError`` beyond ``max_open_sessions``)."""
        return await self._pipeline.submit(self.request_id("open"), None, metadata=self._metadata("open"))

    async def append(self, chunk: Any, *, request_id: str | None = None) -> Any:
        """Feed one chunk; its output goes into :meth:`events`; returns the append's result.

        ``request_id`` lets the caller abort this append (``pipeline.abort``),
        which raises :class:`~omni_trio.RequestAborted` here; the session stays open.
        """
        if self._closed:
            raise SessionClosed(f"session {self.session_id!r} is closed")
        rid = request_id or self.request_id("append")
        result = None
        async with self._pipeline.stream(rid, chunk, metadata=self._metadata("append")) as events:
            async for event in events:
                self._send.send_nowait(event)
                if isinstance(event, CompleteMessage):
                    result = event.result
        return result

    async def control(self, *, preempt: bool = False, preempted_request_ids: Collection[str] = ()) -> Any:
        """Send a ``control``: ``preempt`` cuts this session's running appends short;
        ``preempted_request_ids`` are aborted (their callers get ``RequestAborted``)."""
        metadata = self._metadata("control", preempt=preempt, preempted_request_ids=list(preempted_request_ids))
        return await self._pipeline.submit(self.request_id("control"), None, metadata=metadata)

    def events(self) -> trio.MemoryReceiveChannel[SessionEvent]:
        """The output of every append, in order; iteration ends once the session is closed."""
        return self._receive

    async def close(self) -> Any:
        """Close the session everywhere (once; later calls return None).

        Runs shielded from cancellation, bounded by :data:`CLOSE_DEADLINE_S`, so
        a cancelled block still releases the session's state in every stage.
        """
        if self._closed:
            return None
        self._closed = True
        try:
            with trio.CancelScope(shield=True):
                return await self._pipeline.submit(
                    self.request_id("close"), None, metadata=self._metadata("close"), deadline=CLOSE_DEADLINE_S
                )
        finally:
            self._send.close()
