"""The ASGI app (Starlette): the OpenAI endpoints, /health and /metrics.

Every handler runs on the pipeline's own trio loop (Starlette runs on anyio,
and hypercorn's trio worker drives it), so a handler calls the pipeline
directly. See docs/serving.md.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from omni_trio.config import ServeConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import OmniTrioError, describe_error
from omni_trio.serve.adapter import Completion, PipelineInput, ServeAdapter
from omni_trio.serve.answers import (
    Answer,
    ClientGone,
    ServerError,
    Tracker,
    error_for,
    request_id,
    unless_client_leaves,
)
from omni_trio.serve.audio import wav_header
from omni_trio.serve.json_body import parse_json_object
from omni_trio.serve.limits import SocketLimits
from omni_trio.serve.metrics import Metrics
from omni_trio.serve.realtime.endpoint import Realtime
from omni_trio.serve.schemas import (
    ChatRequest,
    HTTPError,
    SpeechRequest,
    chat_request,
    speech_request,
)
from omni_trio.serve.speech_socket import SpeechSocket
from omni_trio.serve.transcriptions import Transcriptions
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

_SPEECH_MEDIA = {"pcm": "audio/pcm", "wav": "audio/wav"}
_OUTCOME_OF_STATUS = {400: "bad_request", 404: "not_found", 413: "too_large"}


def _error_response(error: HTTPError) -> JSONResponse:
    headers = error.headers if isinstance(error, ServerError) else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class OpenAIApp:
    """The routes of one server, bound to one pipeline and its adapter."""

    def __init__(self, pipeline: Pipeline, config: ServeConfig, adapter: ServeAdapter, metrics: Metrics,
                 limits: SocketLimits) -> None:
        self._pipeline = pipeline
        self._config = config
        self._adapter = adapter
        self._metrics = metrics
        self._created = int(time.time())
        self._scrape = trio.Lock()
        self._limits = limits
        transcriptions = Transcriptions(pipeline, config, adapter, metrics)
        realtime = Realtime(pipeline, config, adapter, limits, metrics)
        self.asgi = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
                Route("/v1/audio/speech", self.speech, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/audio/transcriptions", transcriptions.create, methods=["POST"]),
                WebSocketRoute("/v1/audio/speech/stream", self.speech_stream),
                WebSocketRoute("/v1/realtime", realtime.connect),
            ],
            exception_handlers={HTTPException: self._http_exception},
        )

    # ------------------------------------------------------------------ plain endpoints

    async def _http_exception(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = HTTPError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                          type="invalid_request_error", code="not_found" if exc.status_code == 404 else None)
        return _error_response(error)

    async def models(self, request: Request) -> Response:
        """``GET /v1/models``: the one model this server serves."""
        model = {"id": self._config.model, "object": "model", "created": self._created, "owned_by": "omni-trio"}
        return JSONResponse({"object": "list", "data": [model]})

    async def health(self, request: Request) -> Response:
        """``GET /health``: 200 when every stage process is alive and ready, else 503 naming the others."""
        health = self._pipeline.health()
        if health.ok:
            return JSONResponse({"status": "ok", "processes": health.processes})
        return JSONResponse({"status": "unavailable", "processes": health.processes,
                             "not_ready": health.not_ready()}, status_code=503)

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text format, the runtime totals from a fresh ``stats()``.

        Scrapes take their snapshot one at a time, so snapshots are observed in the
        order they were taken. When the stages do not answer (a worker is just
        dying), the last totals are shown.
        """
        async with self._scrape:
            try:
                stats = await self._pipeline.stats()
            except (trio.TooSlowError, OmniTrioError) as exc:
                log.warning("metrics_stats_unavailable", error=describe_error(exc))
            else:
                self._metrics.runtime.observe(stats)
        return Response(self._metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ model endpoints

    async def speech_stream(self, websocket: WebSocket) -> None:
        """``WS /v1/audio/speech/stream`` (:mod:`omni_trio.serve.speech_socket`)."""
        await SpeechSocket(websocket, self._pipeline, self._config, self._adapter, self._limits).run()

    async def _read_body(self, request: Request) -> bytes:
        limit = self._config.max_body_bytes
        too_large = HTTPError(413, f"the request body is larger than {limit} bytes", type="invalid_request_error",
                              code="body_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_large
        return bytes(body)

    def _check_model(self, model: str) -> None:
        if model != self._config.model:
            raise HTTPError(404, f"the model {model!r} does not exist; this server serves {self._config.model!r}",
                            type="invalid_request_error", param="model", code="model_not_found")

    async def _begin(self, request: Request, tracker: Tracker, kind: str, given: PipelineInput,
                     deadline: float | None) -> Answer:
        rid = request_id(kind)
        deadline = deadline if deadline is not None else self._config.deadline_s
        try:
            return await unless_client_leaves(
                request, lambda: Answer.start(self._pipeline, self._adapter, rid, given, deadline)
            )
        except OmniTrioError as exc:
            raise error_for(exc, self._config.retry_after_s) from exc

    def _failed(self, tracker: Tracker, error: HTTPError) -> Response:
        tracker.finish(error.outcome if isinstance(error, ServerError) else _OUTCOME_OF_STATUS.get(error.status,
                                                                                                   "bad_request"))
        return _error_response(error)

    async def speech(self, request: Request) -> Response:
        """``POST /v1/audio/speech``: raw audio bytes as they are made, or SSE deltas."""
        tracker = Tracker(self._metrics)
        try:
            speech = speech_request(parse_json_object(await self._read_body(request)))
            self._check_model(speech.model)
            answer = await self._begin(request, tracker, "speech", self._adapter.speech_input(speech),
                                       speech.deadline)
        except HTTPError as error:
            return self._failed(tracker, error)
        except ClientGone:
            tracker.finish("disconnected")
            return Response(status_code=499)
        sse = speech.stream_format == "sse"
        media = "text/event-stream" if sse else _SPEECH_MEDIA[speech.response_format]
        return StreamingResponse(self._speech_body(answer, speech, tracker), media_type=media)

    async def _speech_body(self, answer: Answer, speech: SpeechRequest, tracker: Tracker) -> AsyncIterator[bytes]:
        sse = speech.stream_format == "sse"
        header = wav_header(self._adapter.sample_rate) if speech.response_format == "wav" else b""
        completion = Completion("")
        try:
            async for piece in answer.pieces():
                if isinstance(piece, Completion):
                    completion = piece
                elif piece.audio:
                    data, header = header + piece.audio, b""
                    tracker.audio(len(piece.audio) * answer.seconds_per_byte)
                    yield _sse({"type": "speech.audio.delta", "audio": _b64(data)}) if sse else data
            if sse:
                usage = {"input_tokens": completion.input_tokens, "output_tokens": completion.output_tokens,
                         "total_tokens": completion.input_tokens + completion.output_tokens}
                yield _sse({"type": "speech.audio.done", "usage": usage})
            tracker.finish("ok")
        except OmniTrioError as exc:
            error = error_for(exc, self._config.retry_after_s)
            tracker.finish(error.outcome)
            if not sse:
                raise  # a raw byte stream cannot carry an error: the connection is cut
            yield _sse(error.body())
        finally:
            tracker.finish("disconnected")

    async def chat(self, request: Request) -> Response:
        """``POST /v1/chat/completions``: one JSON answer, or ``chat.completion.chunk`` SSE."""
        tracker = Tracker(self._metrics)
        try:
            chat = chat_request(parse_json_object(await self._read_body(request)))
            self._check_model(chat.model)
            answer = await self._begin(request, tracker, "chat", self._adapter.chat_input(chat), chat.deadline)
            if not chat.stream:
                body = await unless_client_leaves(request, lambda: self._chat_body(answer, chat, tracker))
                tracker.finish("ok")
                return JSONResponse(body)
        except HTTPError as error:
            return self._failed(tracker, error)
        except OmniTrioError as exc:
            return self._failed(tracker, error_for(exc, self._config.retry_after_s))
        except ClientGone:
            tracker.finish("disconnected")
            return Response(status_code=499)
        return StreamingResponse(self._chat_chunks(answer, chat, tracker), media_type="text/event-stream")

    def _usage(self, completion: Completion) -> dict[str, int]:
        return {"prompt_tokens": completion.input_tokens, "completion_tokens": completion.output_tokens,
                "total_tokens": completion.input_tokens + completion.output_tokens}

    async def _chat_body(self, answer: Answer, chat: ChatRequest, tracker: Tracker) -> dict[str, Any]:
        text, audio, completion = "", bytearray(), Completion("")
        async for piece in answer.pieces():
            if isinstance(piece, Completion):
                completion = piece
            else:
                text += piece.text
                if piece.audio and chat.wants_audio:
                    tracker.audio(len(piece.audio) * answer.seconds_per_byte)
                    audio += piece.audio
        content = completion.text or text
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if chat.wants_audio:
            header = wav_header(self._adapter.sample_rate, len(audio)) if chat.audio_format == "wav" else b""
            message["audio"] = {"id": f"audio-{answer.request_id}", "data": _b64(header + bytes(audio)),
                                "expires_at": int(time.time()) + 3600, "transcript": content}
        return {
            "id": f"chatcmpl-{answer.request_id}", "object": "chat.completion", "created": int(time.time()),
            "model": self._config.model, "usage": self._usage(completion),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }

    async def _chat_chunks(self, answer: Answer, chat: ChatRequest, tracker: Tracker) -> AsyncIterator[bytes]:
        base = {"id": f"chatcmpl-{answer.request_id}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self._config.model}
        audio_id = f"audio-{answer.request_id}"

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})

        header = wav_header(self._adapter.sample_rate) if chat.audio_format == "wav" else b""
        streamed, completion = "", Completion("")
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for piece in answer.pieces():
                if isinstance(piece, Completion):
                    completion = piece
                    continue
                if piece.text:
                    streamed += piece.text
                    yield chunk({"content": piece.text})
                if piece.audio and chat.wants_audio:
                    data, header = header + piece.audio, b""
                    tracker.audio(len(piece.audio) * answer.seconds_per_byte)
                    yield chunk({"audio": {"id": audio_id, "data": _b64(data)}})
            rest = completion.text[len(streamed):] if completion.text.startswith(streamed) else ""
            if rest:
                yield chunk({"content": rest})
            if chat.wants_audio:
                yield chunk({"audio": {"id": audio_id, "transcript": completion.text or streamed}})
            yield chunk({}, finish_reason="stop")
            if chat.include_usage:
                yield _sse({**base, "choices": [], "usage": self._usage(completion)})
            yield _sse("[DONE]")
            tracker.finish("ok")
        except OmniTrioError as exc:
            error = error_for(exc, self._config.retry_after_s)
            tracker.finish(error.outcome)
            yield _sse(error.body())
        finally:
            tracker.finish("disconnected")

