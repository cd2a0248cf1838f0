"""``WS /v1/audio/speech/stream``: text in as it is written, speech out sentence by sentence.

The message shapes are SGLang-Omni's (``serve/speech_ws``) and vLLM-Omni's:

* client: ``{"type": "session.config", "session": {"voice", "speed", "split_granularity"}}`` first
  (``split_granularity``: ``sentence``, the default, or ``clause``), then ``{"type": "input.text",
  "text"}`` any number of times, ``{"type": "input.commit"}`` to speak what is buffered now, and
  ``{"type": "input.done"}`` at the end;
* server: ``{"type": "session.configured", "session_id", "response_format": "pcm", "sample_rate",
  "split_granularity"}``; per sentence ``{"type": "audio.start", "id", "sentence_index",
  "sentence_text", "format", "sample_rate"}``, binary frames of PCM16 mono, then ``{"type":
  "audio.done", "id", "sentence_index", "total_bytes", "error"}``; after ``input.done`` and the last
  sentence ``{"type": "session.done", "session_id", "total_sentences"}`` and the socket closes;
  ``{"type": "error", "message", "code", "param"}`` for a bad message (the session goes on).

A sentence is spoken as soon as its end (``.!?``, or ``,;`` by clause) is
followed by more text, while the client is still writing the next one; each
is one pipeline request (the adapter's ``speech_input``), one at a time.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Any

import trio
from starlette.websockets import WebSocket, WebSocketDisconnect

from omni_trio.config import ServeConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import OmniTrioError
from omni_trio.serve.adapter import Completion, ServeAdapter
from omni_trio.serve.answers import Answer, error_for
from omni_trio.serve.events import BadEvent, dumps, parse_event
from omni_trio.serve.limits import SocketLimits
from omni_trio.serve.schemas import HTTPError, SpeechRequest

#: Where a piece of text may be cut: after these marks, before whitespace.
SPLITS = {"sentence": re.compile(r"(?<=[.!?。！？])\s+"), "clause": re.compile(r"(?<=[.!?。！？,;，；])\s+")}


def split_ready(buffer: str, granularity: str) -> tuple[list[str], str]:
    """The complete sentences (or clauses) at the start of ``buffer``, and the rest still being written."""
    parts = SPLITS[granularity].split(buffer)
    return [p.strip() for p in parts[:-1] if p.strip()], parts[-1]


class SpeechSocket:
    """One connection of ``/v1/audio/speech/stream``."""

    def __init__(self, websocket: WebSocket, pipeline: Pipeline, config: ServeConfig, adapter: ServeAdapter,
                 limits: SocketLimits) -> None:
        self._ws = websocket
        self._pipeline = pipeline
        self._config = config
        self._adapter = adapter
        self._limits = limits
        self.session_id = f"speech_ws_{secrets.token_hex(8)}"
        self._send_lock = trio.Lock()
        self._voice, self._speed, self._granularity = "alloy", 1.0, "sentence"
        self._buffer = ""
        self._spoken = 0
        self._sentences, self._to_speak = trio.open_memory_channel[str](math.inf)

    async def send(self, event: dict[str, Any]) -> None:
        """Send one JSON event (tasks take turns)."""
        async with self._send_lock:
            await self._ws.send_text(dumps(event))

    async def _error(self, problem: BadEvent) -> None:
        await self.send({"type": "error", "message": problem.message, "code": problem.code, "param": problem.param})

    async def _receive(self) -> dict[str, Any] | None:
        """The next event; None when the client left or was idle too long (the socket is then closed)."""
        with trio.move_on_after(self._limits.idle_timeout_s):
            message = await self._ws.receive()
            if message["type"] == "websocket.disconnect":
                return None
            if message.get("text") is None:
                raise BadEvent("this socket takes JSON text messages, not binary ones", code="invalid_event")
            return parse_event(message["text"])
        await self._error(BadEvent(f"no message for {self._limits.idle_timeout_s} s; closing", code="idle_timeout"))
        return None

    async def run(self) -> None:
        """Serve the connection until ``input.done``, a disconnect or the idle time."""
        await self._ws.accept()
        try:
            if not await self._configure():
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._speak_all)
                done = await self._take_text()
                if not done:
                    nursery.cancel_scope.cancel()  # the client left: abort what is being spoken
                    return
            await self.send({"type": "session.done", "session_id": self.session_id, "total_sentences": self._spoken})
            await self._ws.close()
        except WebSocketDisconnect:
            return

    async def _configure(self) -> bool:
        while True:
            try:
                event = await self._receive()
                if event is None:
                    return False
                if event["type"] != "session.config":
                    raise BadEvent("the first message must be session.config", param="type")
                self._apply_config(event.get("session", {}))
            except BadEvent as problem:
                await self._error(problem)
                continue
            await self.send({"type": "session.configured", "session_id": self.session_id, "response_format": "pcm",
                             "sample_rate": self._adapter.sample_rate, "split_granularity": self._granularity})
            return True

    def _apply_config(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise BadEvent("'session' must be an object", param="session")
        model = session.get("model", self._config.model)
        if model != self._config.model:
            raise BadEvent(f"the model {model!r} does not exist; this server serves {self._config.model!r}",
                           code="model_not_found", param="session.model")
        voice, speed = session.get("voice", self._voice), session.get("speed", self._speed)
        granularity = session.get("split_granularity", self._granularity)
        if not isinstance(voice, str) or not voice:
            raise BadEvent("'voice' must be a non-empty string", param="session.voice")
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.25 <= speed <= 4.0:
            raise BadEvent(f"'speed' must be a number in [0.25, 4.0], got {speed!r}", param="session.speed")
        if granularity not in SPLITS:
            raise BadEvent(f"'split_granularity' must be one of {', '.join(SPLITS)}, got {granularity!r}",
                           param="session.split_granularity")
        if session.get("response_format", "pcm") != "pcm":
            raise BadEvent("only response_format 'pcm' is streamed", param="session.response_format")
        self._voice, self._speed, self._granularity = voice, float(speed), granularity

    async def _take_text(self) -> bool:
        """Read ``input.*`` events until ``input.done`` (True) or the end of the connection (False)."""
        while True:
            try:
                event = await self._receive()
                if event is None:
                    return False
                kind = event["type"]
                if kind == "input.text":
                    text = event.get("text")
                    if not isinstance(text, str):
                        raise BadEvent("'text' must be a string", param="text")
                    if len(self._buffer) + len(text) > self._limits.max_text_chars:
                        raise BadEvent(f"more than {self._limits.max_text_chars} characters are waiting to be "
                                       "spoken; commit them first", code="text_too_long", param="text")
                    ready, self._buffer = split_ready(self._buffer + text, self._granularity)
                elif kind in ("input.commit", "input.done"):
                    ready, self._buffer = [s for s in [self._buffer.strip()] if s], ""
                else:
                    raise BadEvent(f"unknown event type {kind!r} (input.text, input.commit, input.done)",
                                   param="type")
                for sentence in ready:
                    self._sentences.send_nowait(sentence)
                if kind == "input.done":
                    self._sentences.close()
                    return True
            except BadEvent as problem:
                await self._error(problem)

    async def _speak_all(self) -> None:
        async for sentence in self._to_speak:
            await self._speak(sentence, self._spoken)
            self._spoken += 1

    async def _speak(self, sentence: str, index: int) -> None:
        rid = f"{self.session_id}-{index}"
        request = SpeechRequest(model=self._config.model, input=sentence, voice=self._voice, speed=self._speed)
        sent, failed = 0, False
        try:
            answer = await Answer.start(self._pipeline, self._adapter, rid, self._adapter.speech_input(request),
                                        self._config.deadline_s)
            await self.send({"type": "audio.start", "id": rid, "sentence_index": index, "sentence_text": sentence,
                             "format": "pcm", "sample_rate": self._adapter.sample_rate})
            async for piece in answer.pieces():
                if not isinstance(piece, Completion) and piece.audio:
                    async with self._send_lock:
                        await self._ws.send_bytes(piece.audio)
                    sent += len(piece.audio)
        except (OmniTrioError, HTTPError) as exc:
            failed = True
            error = error_for(exc, self._config.retry_after_s) if isinstance(exc, OmniTrioError) else exc
            await self.send({"type": "error", "message": error.message, "code": error.code, "param": error.param})
        await self.send({"type": "audio.done", "id": rid, "sentence_index": index, "total_bytes": sent,
                         "error": failed})
