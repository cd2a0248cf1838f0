"""One ``/v1/realtime`` connection: one transcription session of the pipeline, and its answers.

Tasks of a connection (one nursery; the socket closing cancels them all, and
leaving the nursery closes the pipeline session and aborts an answer in flight):

* the receiver reads client events and acts at once (they never wait on the pipeline);
* the listener appends the turn's audio to the transcription session in order and
  sends the transcripts (``conversation.item.input_audio_transcription.delta/.completed``);
* at most one answer (``response.*``): a pipeline request made from a turn's
  transcript, its audio sent paced to playback (``output_lead_s`` ahead) so
  that a barge-in cuts what the listener has not heard yet.
"""

from __future__ import annotations

import base64
import binascii
import collections
import math
import secrets
from typing import Any

import attrs
import trio
from starlette.websockets import WebSocket

from omni_trio.config import ServeConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import OmniTrioError, describe_error
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.serve.adapter import ServeAdapter
from omni_trio.serve.events import BadEvent, dumps, parse_event
from omni_trio.serve.limits import SocketLimits
from omni_trio.serve.listening import Listener, appended_text
from omni_trio.serve.metrics import Metrics
from omni_trio.serve.realtime.session import RATE, Settings, updated
from omni_trio.serve.realtime.vad import VoiceActivity


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


@attrs.define
class Turn:
    """A user turn: its audio went to the transcription session; ``heard`` is set with the final transcript."""

    item_id: str
    audio_bytes: int = 0
    transcript: str = ""
    heard: trio.Event = attrs.Factory(trio.Event)
    ended_at: float = 0.0


class Connection:
    """The realtime protocol of one client over ``listener``'s transcription session."""

    def __init__(self, websocket: WebSocket, pipeline: Pipeline, config: ServeConfig, adapter: ServeAdapter,
                 limits: SocketLimits, metrics: Metrics, listener: Listener) -> None:
        self._ws = websocket
        self._pipeline = pipeline
        self._config = config
        self._adapter = adapter
        self._limits = limits
        self._metrics = metrics
        self._listener = listener
        self.session_id = _id("sess")
        self._settings = Settings(model=config.model)
        self._send_lock = trio.Lock()
        self._to_listener, self._listen_queue = trio.open_memory_channel[tuple[str, Turn, bytes]](math.inf)
        self._turn: Turn | None = None  # the turn whose audio is arriving
        self._last_heard: Turn | None = None  # the latest committed turn
        self._session_audio_bytes = 0
        self._vad = self._new_vad()
        self._prefix: collections.deque[bytes] = collections.deque()
        self._response: tuple[str, trio.CancelScope] | None = None

    def _new_vad(self) -> VoiceActivity | None:
        detection = self._settings.turn_detection
        return None if detection is None else VoiceActivity(
            RATE, threshold=detection.threshold, silence_duration_ms=detection.silence_duration_ms)

    # ------------------------------------------------------------------ sending

    async def send(self, event: dict[str, Any]) -> None:
        """Send one server event (tasks take turns; each gets an ``event_id``)."""
        async with self._send_lock:
            await self._ws.send_text(dumps({"event_id": _id("event"), **event}))

    async def error(self, problem: BadEvent) -> None:
        """An ``error`` event naming the problem and the client event that caused it; the session goes on."""
        await self.send({"type": "error", "error": {"type": "invalid_request_error", "code": problem.code,
                                                    "message": problem.message, "param": problem.param,
                                                    "event_id": problem.event_id}})

    # ------------------------------------------------------------------ receiving

    async def run(self) -> None:
        """Serve the connection until the client leaves or is idle too long."""
        await self.send({"type": "session.created", "session": self._settings.as_dict(self.session_id)})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen)
            self._nursery = nursery
            try:
                await self._receive_all()
            finally:
                nursery.cancel_scope.cancel()

    async def _receive_all(self) -> None:
        while True:
            message = None
            with trio.move_on_after(self._limits.idle_timeout_s):
                message = await self._ws.receive()
            if message is None and self._response is not None:
                continue  # a client listening to an answer is not idle
            if message is None:
                await self.error(BadEvent(f"no event for {self._limits.idle_timeout_s} s; closing",
                                          code="idle_timeout"))
                await self._ws.close(1000)
                return
            if message["type"] == "websocket.disconnect":
                return
            event_id = None
            try:
                if message.get("text") is None:
                    raise BadEvent("events are JSON text messages, not binary ones")
                event = parse_event(message["text"])
                event_id = event.get("event_id")
                await self._handle(event)
            except BadEvent as problem:
                if problem.event_id is None and isinstance(event_id, str):
                    problem.event_id = event_id
                await self.error(problem)

    async def _handle(self, event: dict[str, Any]) -> None:
        kind, event_id = event["type"], event.get("event_id")
        try:
            if kind == "session.update":
                self._settings = updated(self._settings, event.get("session"))
                self._vad = self._new_vad()
                await self.send({"type": "session.updated", "session": self._settings.as_dict(self.session_id)})
            elif kind == "input_audio_buffer.append":
                await self._append(event.get("audio"))
            elif kind == "input_audio_buffer.commit":
                await self._commit()
            elif kind == "input_audio_buffer.clear":
                if self._turn is not None:
                    await self._to_listener.send(("drop", self._turn, b""))
                    self._turn = None
                await self.send({"type": "input_audio_buffer.cleared"})
            elif kind == "response.create":
                await self._create_response()
            elif kind == "response.cancel":
                if self._response is None:
                    raise BadEvent("there is no response in progress to cancel", code="response_cancel_not_active")
                self._response[1].cancel()
            else:
                raise BadEvent(f"unknown or unsupported event type {kind!r}", code="invalid_event_type", param="type")
        except BadEvent as problem:
            problem.event_id = event_id if isinstance(event_id, str) else None
            raise

    # ------------------------------------------------------------------ input audio

    async def _append(self, audio: Any) -> None:
        if not isinstance(audio, str):
            raise BadEvent("'audio' must be base64 PCM16", param="audio")
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadEvent(f"'audio' is not valid base64: {exc}", code="invalid_base64", param="audio") from None
        if len(pcm) % 2:
            raise BadEvent("'audio' must hold whole PCM16 samples (an even number of bytes)",
                           code="invalid_audio", param="audio")
        if self._session_audio_bytes + len(pcm) > self._limits.max_session_audio_s * 2 * RATE:
            raise BadEvent(f"this session has sent {self._limits.max_session_audio_s} s of audio, its limit",
                           code="session_audio_limit", param="audio")
        self._session_audio_bytes += len(pcm)
        if self._vad is None:
            await self._hear(pcm)
            return
        # One append may hold the start and the end of speech, or several turns: split it where the
        # detector's events fall, so each piece goes where it belongs (the prefix, the turn).
        before = self._vad.bytes_fed
        cursor = 0
        for what, at_ms in self._vad.feed(pcm):
            cut = min(max(at_ms * RATE // 1000 * 2 - before, cursor), len(pcm))
            piece, cursor = pcm[cursor:cut], cut
            if what == "start":
                self._keep_prefix(piece)
                await self._speech_started(at_ms)
            else:
                if piece:
                    await self._hear(piece)
                await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": at_ms,
                                 "item_id": self._turn.item_id if self._turn else None})
                await self._commit()
        rest = pcm[cursor:]
        if self._vad.in_speech:
            if rest:
                await self._hear(rest)
        else:
            self._keep_prefix(rest)

    def _keep_prefix(self, pcm: bytes) -> None:
        """Audio before speech starts: only the last ``prefix_padding_ms`` of it is kept for the turn."""
        if not pcm:
            return
        self._prefix.append(pcm)
        detection = self._settings.turn_detection
        keep = (detection.prefix_padding_ms if detection else 0) * 2 * RATE // 1000
        while sum(map(len, self._prefix)) - len(self._prefix[0]) > keep:
            self._prefix.popleft()

    async def _speech_started(self, at_ms: int) -> None:
        detection = self._settings.turn_detection
        if self._response is not None and detection is not None and detection.interrupt_response:
            self._metrics.realtime_barge_ins.inc()
            self._response[1].cancel()
        prefix, self._prefix = b"".join(self._prefix), collections.deque()
        self._turn = Turn(_id("item"))
        await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": at_ms,
                         "item_id": self._turn.item_id})
        if prefix:
            await self._hear(prefix)

    async def _hear(self, pcm: bytes) -> None:
        if self._turn is None:
            self._turn = Turn(_id("item"))
        if self._turn.audio_bytes + len(pcm) > self._limits.max_turn_audio_s * 2 * RATE:
            raise BadEvent(f"a turn holds at most {self._limits.max_turn_audio_s} s of audio; commit it",
                           code="turn_audio_limit", param="audio")
        self._turn.audio_bytes += len(pcm)
        await self._to_listener.send(("audio", self._turn, pcm))

    async def _commit(self) -> None:
        turn = self._turn
        if turn is None or turn.audio_bytes < RATE * 2 // 10:
            raise BadEvent("the input audio buffer holds less than 100 ms of audio",
                           code="input_audio_buffer_commit_empty")
        self._turn = None
        turn.ended_at = trio.current_time()
        self._metrics.realtime_turns.inc()
        previous = self._last_heard.item_id if self._last_heard else None
        self._last_heard = turn
        await self.send({"type": "input_audio_buffer.committed", "item_id": turn.item_id, "previous_item_id": previous})
        await self._to_listener.send(("end", turn, b""))
        detection = self._settings.turn_detection
        if detection is not None and detection.create_response and self._response is None:
            self._start_response(turn)

    async def _listen(self) -> None:
        """Feed the transcription session in order; send what it hears."""
        text = ""
        async for what, turn, pcm in self._listen_queue:
            try:
                said = await (self._listener.hear(pcm) if what == "audio" else self._listener.end_utterance())
            except OmniTrioError as exc:  # the pipeline failed this piece of the turn; the session goes on
                said = []
                await self.send({"type": "error", "error": {
                    "type": "server_error", "code": "transcription_failed", "param": None, "event_id": None,
                    "message": f"transcribing the input audio failed: {describe_error(exc)}"}})
            for transcript in said if what != "drop" else []:
                delta = appended_text(text, transcript.text)
                text = "" if transcript.final else transcript.text
                if delta and not transcript.final:
                    await self.send({"type": "conversation.item.input_audio_transcription.delta",
                                     "item_id": turn.item_id, "content_index": 0, "delta": delta})
                if transcript.final:
                    turn.transcript = transcript.text
            if what == "end":
                turn.heard.set()
                await self.send({"type": "conversation.item.input_audio_transcription.completed",
                                 "item_id": turn.item_id, "content_index": 0, "transcript": turn.transcript,
                                 "usage": {"type": "duration", "seconds": round(turn.audio_bytes / 2 / RATE, 3)}})
            elif what == "drop":
                text = ""

    # ------------------------------------------------------------------ answers

    async def _create_response(self) -> None:
        if self._response is not None:
            raise BadEvent("a response is in progress; cancel it first",
                           code="conversation_already_has_active_response")
        if self._last_heard is None:
            raise BadEvent("there is no committed user audio to answer", code="response_without_input")
        self._start_response(self._last_heard)

    def _start_response(self, turn: Turn) -> None:
        response_id = _id("resp")
        scope = trio.CancelScope()
        self._response = (response_id, scope)
        self._nursery.start_soon(self._answer, turn, response_id, scope)

    async def _answer(self, turn: Turn, response_id: str, scope: trio.CancelScope) -> None:
        settings = self._settings.response()
        modalities = ["audio"] if settings.audio else ["text"]
        base = {"response_id": response_id, "item_id": f"item_{response_id}", "output_index": 0, "content_index": 0}
        await self.send({"type": "response.created", "response": {"id": response_id, "object": "realtime.response",
                                                                   "status": "in_progress", "output": [],
                                                                   "output_modalities": modalities}})
        status, details, text = "completed", None, ""
        with scope:
            try:
                await turn.heard.wait()
                text = await self._speak(turn, response_id, base, settings.audio)
            except OmniTrioError as exc:
                status, details = "failed", {"type": "failed", "error": {"type": "server_error",
                                                                        "message": describe_error(exc)}}
        if scope.cancelled_caught:
            status, details = "cancelled", {"type": "cancelled", "reason": "turn_detected"}
        self._response = None
        with trio.CancelScope(shield=True):
            item = {"id": base["item_id"], "type": "message", "role": "assistant", "status": status,
                    "content": [{"type": "output_audio" if settings.audio else "output_text", "transcript": text}]}
            await self.send({"type": "response.done", "response": {
                "id": response_id, "object": "realtime.response", "status": status, "status_details": details,
                "output": [item], "output_modalities": modalities}})

    async def _speak(self, turn: Turn, response_id: str, base: dict[str, Any], audio: bool) -> str:
        given = self._adapter.response_input(turn.transcript, self._settings.response())
        text, played_s, started = "", 0.0, None
        async with self._pipeline.stream(response_id, given.inputs, params=given.params) as events:
            async for event in events:
                if isinstance(event, CompleteMessage):
                    text = self._adapter.completion(event.result).text or text
                    continue
                assert isinstance(event, StreamMessage)
                delta = self._adapter.delta(event)
                text += delta.text
                if not (audio and delta.audio):
                    continue
                if started is None:
                    started = trio.current_time()
                    self._metrics.realtime_response_latency.observe(started - turn.ended_at)
                # Paced to playback: at most output_lead_s ahead of what the listener has heard.
                await trio.sleep_until(started + played_s - self._limits.output_lead_s)
                await self.send({"type": "response.output_audio.delta", **base,
                                 "delta": base64.b64encode(delta.audio).decode("ascii")})
                played_s += len(delta.audio) / 2 / self._adapter.sample_rate
        kind = "response.output_audio_transcript" if audio else "response.output_text"
        await self.send({"type": f"{kind}.delta", **base, "delta": text})
        await self.send({"type": f"{kind}.done", **base, ("transcript" if audio else "text"): text})
        if audio:
            await self.send({"type": "response.output_audio.done", **base})
        return text
