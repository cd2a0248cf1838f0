"""One model request's life on the server: admission, its events as deltas, its outcome.

:class:`Answer` opens the pipeline stream and waits for its first event
before the response starts, so admission errors and early failures still get
their status code. If the client goes away meanwhile, or later while the body
streams, the request is aborted in every stage at once (the pipeline's
``stream`` aborts when it is left early).
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import outcome
import trio
from starlette.requests import Request

from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.coordinator.request_stream import RequestStream
from omni_trio.errors import (
    OmniTrioError,
    PipelineClosed,
    QueueFullError,
    RequestAborted,
    RequestFailed,
    RequestTimeout,
    StageProcessDied,
)
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.serve.adapter import Completion, Delta, PipelineInput, ServeAdapter
from omni_trio.serve.metrics import Metrics, Playback
from omni_trio.serve.schemas import HTTPError

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer started."""


class ServerError(HTTPError):
    """An error of the pipeline, answered with the status and outcome it maps to."""

    def __init__(
        self, status: int, message: str, *, type: str, code: str, outcome: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, message, type=type, code=code)
        self.outcome = outcome
        self.headers = headers or {}


def error_for(exc: OmniTrioError, retry_after_s: int) -> ServerError:
    """The HTTP error a pipeline exception maps to."""
    if isinstance(exc, QueueFullError):
        return ServerError(429, f"the server is at capacity: {exc}", type="rate_limit_error", code="queue_full",
                           outcome="queue_full", headers={"Retry-After": str(retry_after_s)})
    if isinstance(exc, RequestTimeout):
        return ServerError(504, str(exc), type="timeout_error", code="deadline_exceeded", outcome="timeout")
    if isinstance(exc, (RequestFailed, StageProcessDied)):
        return ServerError(500, str(exc), type="server_error", code="stage_failed", outcome="failed")
    if isinstance(exc, (PipelineClosed, RequestAborted)):
        return ServerError(503, str(exc), type="server_error", code="unavailable", outcome="unavailable")
    return ServerError(500, f"{type(exc).__name__}: {exc}", type="server_error", code="internal_error",
                       outcome="failed")


async def unless_client_leaves(request: Request, fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn``; cancel it and raise :class:`ClientGone` if the client disconnects first.

    Call it once the body was read: what is left to receive is the disconnect.
    """
    gone = False
    result: outcome.Outcome[T] | None = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        result = await outcome.acapture(fn)
        nursery.cancel_scope.cancel()
    if gone or result is None:
        raise ClientGone
    return result.unwrap()


class Tracker:
    """Counts one model request in the metrics exactly once, whatever way it ends, and measures its audio."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._started = time.perf_counter()
        self._playback = Playback()
        self._last_audio = self._started
        self._done = False
        metrics.in_flight.inc()

    def audio(self, seconds: float) -> None:
        """Audio playing for ``seconds`` is being sent (the first call is the time to first audio)."""
        now = time.perf_counter()
        if self._playback.start is None:
            self._metrics.first_audio.observe(now - self._started)
            self._metrics.audio_ttfp.observe(now - self._started)
            self._metrics.audio_streams.inc()
        late = self._playback.sent(now, seconds)
        if late > 0:
            self._metrics.audio_gaps.inc()
            self._metrics.audio_underrun.inc(late)
        self._last_audio = now

    def finish(self, how: str) -> None:
        """The request ended with outcome ``how`` (later calls do nothing)."""
        if self._done:
            return
        self._done = True
        self._metrics.in_flight.dec()
        self._metrics.requests.labels(how).inc()
        self._metrics.duration.observe(time.perf_counter() - self._started)
        if self._playback.start is not None:
            self._metrics.audio_streams.dec()
            if self._playback.sent_s > 0:
                self._metrics.audio_rtf.observe((self._last_audio - self._started) / self._playback.sent_s)


_ids = itertools.count()
_RUN = secrets.token_hex(4)


def request_id(kind: str) -> str:
    """A fresh pipeline request id for an HTTP request."""
    return f"http-{kind}-{_RUN}-{next(_ids)}"


class Answer:
    """The pipeline stream of one HTTP request, started, as adapter deltas."""

    def __init__(self, stream: RequestStream, first: StreamMessage | CompleteMessage | None,
                 adapter: ServeAdapter) -> None:
        #: The seconds one byte of the adapter's PCM16 mono audio plays for.
        self.seconds_per_byte = 1 / (2 * adapter.sample_rate)
        self.request_id = stream.request_id
        self._stream = stream
        self._first = first
        self._adapter = adapter

    @classmethod
    async def start(
        cls, pipeline: Pipeline, adapter: ServeAdapter, rid: str, given: PipelineInput, deadline: float | None
    ) -> Answer:
        """Admit the request and wait for its first event; pipeline errors are raised as they are."""
        stream = pipeline.stream(rid, given.inputs, params=given.params, deadline=deadline)
        await stream.__aenter__()
        try:
            first = await stream.__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException:
            await stream.aclose()
            raise
        return cls(stream, first, adapter)

    async def pieces(self) -> AsyncIterator[Delta | Completion]:
        """The answer's deltas, then one :class:`Completion` per terminal result."""
        try:
            event: Any = self._first
            while event is not None:
                if isinstance(event, StreamMessage):
                    delta = self._adapter.delta(event)
                    if delta.text or delta.audio:
                        yield delta
                    if delta.audio:  # passed on: stream admission times this stream by its audio
                        self._stream.declare_playback(len(delta.audio) * self.seconds_per_byte)
                else:
                    yield self._adapter.completion(event.result)
                try:
                    event = await self._stream.__anext__()
                except StopAsyncIteration:
                    event = None
        finally:
            await self._stream.aclose()

    async def aclose(self) -> None:
        """Abort the request if it still runs."""
        await self._stream.aclose()
