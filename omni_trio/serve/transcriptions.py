"""``POST /v1/audio/transcriptions``: OpenAI's multipart form, answered by a transcription session.

The form (parsed by Starlette's multipart parser over a body bounded by
``max_body_bytes``) holds ``file`` (a PCM16 WAV at any rate, or raw PCM16
mono with a ``sample_rate`` field), ``model``, ``response_format`` (``json``,
``text``, ``verbose_json``), ``language`` and ``stream``. With
``stream=true`` the answer is SSE: ``transcript.text.delta`` events as the
transcript grows, then ``transcript.text.done``.
"""

from __future__ import annotations

import json
import wave
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import attrs
import trio
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from omni_trio.config import ServeConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import OmniTrioError
from omni_trio.serve.adapter import ServeAdapter
from omni_trio.serve.answers import ClientGone, ServerError, Tracker, error_for, unless_client_leaves
from omni_trio.serve.audio import wav_pcm16
from omni_trio.serve.listening import Listener, not_transcribing, transcribe_file
from omni_trio.serve.metrics import Metrics
from omni_trio.serve.schemas import BadRequest, HTTPError

RESPONSE_FORMATS = ("json", "text", "verbose_json")
_OUTCOME_OF_STATUS = {404: "not_found", 413: "too_large"}


@attrs.frozen
class Upload:
    """One checked transcription request: its audio as PCM16 mono at ``sample_rate``, and its options."""

    model: str
    pcm: bytes
    sample_rate: int
    response_format: str = "json"
    language: str = ""
    stream: bool = False

    @property
    def duration_s(self) -> float:
        """The audio's length in seconds."""
        return len(self.pcm) / 2 / self.sample_rate


def _text_field(form: FormData, name: str, default: str = "") -> str:
    value = form.get(name, default)
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a form field, not a file", param=name)
    return value


async def parse_upload(form: FormData) -> Upload:
    """Check the form's fields and decode its file; every problem is a 400 naming the field."""
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise BadRequest("the form has no 'file' (the audio to transcribe)", param="file")
    model = _text_field(form, "model")
    if not model:
        raise BadRequest("the form has no 'model'", param="model")
    response_format = _text_field(form, "response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise BadRequest(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}",
                         param="response_format")
    stream = _text_field(form, "stream", "false").lower()
    if stream not in ("true", "false"):
        raise BadRequest(f"'stream' must be true or false, got {stream!r}", param="stream")
    data = await file.read()
    declared_rate = _text_field(form, "sample_rate")
    if data[:4] == b"RIFF":
        try:
            pcm, rate = wav_pcm16(data)
        except (wave.Error, ValueError, EOFError) as exc:
            raise BadRequest(f"'file' is not a PCM16 WAV file: {exc}", param="file") from None
    elif declared_rate:
        if not declared_rate.isdigit() or not 4000 <= int(declared_rate) <= 192_000:
            raise BadRequest(f"'sample_rate' must be a whole number of Hz in [4000, 192000], got {declared_rate!r}",
                             param="sample_rate")
        if len(data) % 2:
            raise BadRequest("raw PCM16 audio must have an even number of bytes", param="file")
        pcm, rate = data, int(declared_rate)
    else:
        raise BadRequest("'file' must be a PCM16 WAV file, or raw PCM16 mono with a 'sample_rate' field",
                         param="file")
    if not pcm:
        raise BadRequest("'file' holds no audio", param="file")
    return Upload(model, pcm, rate, response_format, _text_field(form, "language"), stream == "true")


class TranscriptEvents(Response):
    """The SSE answer of a streamed transcription: runs it while it is sent; a client that leaves cancels it."""

    media_type = "text/event-stream"

    def __init__(self, run: Callable[[Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]) -> None:
        super().__init__(media_type=self.media_type)
        # Response's headers say content-length 0 (its body is empty); this body streams.
        self.raw_headers = [(name, value) for name, value in self.raw_headers if name != b"content-length"]
        self._run = run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def event(data: dict[str, Any]) -> None:
            body = f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})

        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await self._run(event)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            nursery.cancel_scope.cancel()


class Transcriptions:
    """The transcription endpoint of one server."""

    def __init__(self, pipeline: Pipeline, config: ServeConfig, adapter: ServeAdapter, metrics: Metrics) -> None:
        self._pipeline = pipeline
        self._config = config
        self._adapter = adapter
        self._metrics = metrics

    async def _form(self, request: Request) -> FormData:
        limit = self._config.max_body_bytes
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise BadRequest("the body must be multipart/form-data (file, model, ...)")
        length = request.headers.get("content-length", "")
        too_large = HTTPError(413, f"the request body is larger than {limit} bytes", type="invalid_request_error",
                              code="body_too_large")
        if length.isdigit() and int(length) > limit:
            raise too_large

        async def bounded() -> AsyncGenerator[bytes, None]:
            seen = 0
            async for chunk in request.stream():
                seen += len(chunk)
                if seen > limit:
                    raise too_large
                yield chunk

        parser = MultiPartParser(request.headers, bounded(), max_files=1, max_fields=16, max_part_size=limit)
        try:
            return await parser.parse()
        except MultiPartException as exc:
            raise BadRequest(f"the multipart form is malformed: {exc.message}") from None

    async def create(self, request: Request) -> Response:
        """``POST /v1/audio/transcriptions``."""
        tracker = Tracker(self._metrics)
        try:
            unsupported = not_transcribing(self._adapter, self._config.model)
            upload = await parse_upload(await self._form(request))
            if upload.model != self._config.model:
                raise HTTPError(404, f"the model {upload.model!r} does not exist; this server serves "
                                     f"{self._config.model!r}", type="invalid_request_error", param="model",
                                code="model_not_found")
            if unsupported is not None:
                raise unsupported
            if upload.stream:
                return TranscriptEvents(lambda event: self._stream(upload, tracker, event))
            text = await unless_client_leaves(request, lambda: self._transcribe(upload, None))
        except HTTPError as error:
            outcome = error.outcome if isinstance(error, ServerError) else _OUTCOME_OF_STATUS.get(error.status,
                                                                                                  "bad_request")
            tracker.finish(outcome)
            return JSONResponse(error.body(), status_code=error.status,
                                headers=error.headers if isinstance(error, ServerError) else None)
        except ClientGone:
            tracker.finish("disconnected")
            return Response(status_code=499)
        tracker.finish("ok")
        return self._answer(upload, text)

    async def _transcribe(self, upload: Upload, on_delta: Callable[[str], Awaitable[None]] | None) -> str:
        try:
            async with Listener.open(self._pipeline, self._adapter, "transcribe") as session:
                return await transcribe_file(Listener(session, self._adapter, upload.sample_rate), upload.pcm,
                                             on_delta)
        except OmniTrioError as exc:
            raise error_for(exc, self._config.retry_after_s) from exc

    async def _stream(self, upload: Upload, tracker: Tracker, event: Callable[[dict[str, Any]], Awaitable[None]]
                      ) -> None:
        async def delta(text: str) -> None:
            await event({"type": "transcript.text.delta", "delta": text})

        try:
            text = await self._transcribe(upload, delta)
        except ServerError as error:
            tracker.finish(error.outcome)
            await event({"type": "error", **error.body()})
        else:
            await event({"type": "transcript.text.done", "text": text})
            tracker.finish("ok")
        finally:
            tracker.finish("disconnected")  # a client that left: nothing if it finished already

    def _answer(self, upload: Upload, text: str) -> Response:
        if upload.response_format == "text":
            return PlainTextResponse(text)
        seconds = round(upload.duration_s, 3)
        if upload.response_format == "verbose_json":
            return JSONResponse({"task": "transcribe", "language": upload.language or "en", "duration": seconds,
                                 "text": text, "segments": []})
        return JSONResponse({"text": text, "usage": {"type": "duration", "seconds": seconds}})
