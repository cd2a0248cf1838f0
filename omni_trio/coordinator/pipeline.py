"""The user's handle on a running pipeline: :class:`Pipeline`, what ``open_pipeline`` yields.

It holds the pipeline's :class:`~omni_trio.coordinator.coordinator.Coordinator` privately and
offers what a caller does with a pipeline (submit, stream, abort, sessions, stats, health); the
coordinator's hooks for the runtime (stage reports, worker deaths, shutdown) stay on the
coordinator, which only the runtime holds.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_trio.coordinator.coordinator import Coordinator
    from omni_trio.coordinator.request_stream import RequestStream
    from omni_trio.coordinator.sessions import Session
    from omni_trio.coordinator.stats import PipelineHealth, PipelineStats

__all__ = ["Pipeline"]


class Pipeline:
    """A running pipeline, as its caller sees it: yielded by :func:`omni_trio.open_pipeline`.

    ``await pipeline.submit(...)`` runs a request to its result, ``pipeline.stream(...)`` iterates
    over its chunks, ``await pipeline.abort(id)`` ends one everywhere, ``pipeline.session(...)``
    opens a session, ``await pipeline.stats()`` and ``pipeline.health()`` say how it is doing.
    It is valid inside the ``open_pipeline`` block; after it, new requests raise
    :class:`~omni_trio.PipelineClosed`.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    async def submit(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Run one request to completion and return its terminal result.

        With several terminal stages the result is a dict keyed by stage
        name. Raises :class:`~omni_trio.RequestFailed`, :class:`~omni_trio.RequestAborted`,
        :class:`~omni_trio.RequestTimeout` (``deadline`` seconds passed; the request is
        aborted everywhere), :class:`~omni_trio.QueueFullError` (``max_in_flight`` requests
        are live, or a stage refused it for a capacity limit) or
        :class:`~omni_trio.DuplicateRequestId`. Cancelling the caller aborts the request.
        """
        return await self._coordinator.submit(
            request_id, inputs, params=params, metadata=metadata, deadline=deadline
        )

    def stream(
        self,
        request_id: str,
        inputs: Any,
        *,
        params: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> RequestStream:
        """Run one request and iterate over its stream chunks and completions.

        Use as ``async with pipeline.stream(...) as events: async for ev in
        events``: leaving the block early, however, aborts the request before
        the block is left. Directly as ``async for ev in pipeline.stream(...)``,
        a loop left early aborts the request only once the stream object is
        garbage-collected (at once in CPython, unless something still refers to
        it), without waiting for the abort. Yields
        :class:`~omni_trio.StreamMessage` and :class:`~omni_trio.CompleteMessage` objects; ends
        after the last terminal stage completed; raises the request's error.
        """
        return self._coordinator.stream(
            request_id, inputs, params=params, metadata=metadata, deadline=deadline
        )

    async def abort(self, request_id: str) -> bool:
        """Abort a live request everywhere; False if it is unknown or already finished.

        It returns once every stage dropped the request (or after 5 s, for a worker that stopped
        answering). A request still waiting in the caller for its turn to be sent is in no stage:
        its abort is done within the call.
        """
        return await self._coordinator.abort(request_id)

    def session(self, session_id: str, *, stages: list[str]) -> Session:
        """A session whose state lives in ``stages`` (its owner stages, in pipeline order).

        Use as ``async with pipeline.session("s1", stages=["asr"]) as s:`` with
        ``await s.append(chunk)`` and ``async for ev in s.events()``; the block
        opens the session and closes it on exit, whatever the reason (see
        :class:`~omni_trio.Session`).
        """
        return self._coordinator.session(session_id, stages=stages)

    async def stats(self, *, timeout: float | None = None) -> PipelineStats:
        """Counters of every stage and of the coordinator (see :class:`~omni_trio.PipelineStats`).

        Raises :class:`~omni_trio.StatsTimeout`, naming the processes, when a worker process does not
        answer within ``timeout`` seconds (default 10).
        """
        return await self._coordinator.stats(timeout=timeout)

    def health(self) -> PipelineHealth:
        """Whether every stage process is alive and ready; a closed pipeline has none ready."""
        return self._coordinator.health()

    def live_request_ids(self) -> set[str]:
        """Deprecated: the ids of the requests live now. ``(await pipeline.stats()).live_requests``
        counts them; a caller that needs the ids keeps its own."""
        warnings.warn(
            "Pipeline.live_request_ids() is deprecated: (await pipeline.stats()).live_requests counts the "
            "live requests; keep the ids you submitted if you need them",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._coordinator.live_request_ids()
