"""The OpenAI request bodies the server accepts, parsed and checked; its error body.

Bodies are JSON only (nothing in a request is unpickled), parsed by
:mod:`omni_trio.serve.json_body`. Every problem is a
:class:`BadRequest` naming the field, so the client gets a 400 that says
what to fix.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import attrs

SPEECH_FORMATS = ("pcm", "wav")
SPEECH_STREAM_FORMATS = ("audio", "sse")
CHAT_AUDIO_FORMATS = ("pcm16", "wav")
MODALITIES = ("text", "audio")


class HTTPError(Exception):
    """An error answered with OpenAI's error body: ``{"error": {message, type, param, code}}``."""

    def __init__(
        self, status: int, message: str, *, type: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(HTTPError):
    """400: the body is not what the endpoint takes; ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, type="invalid_request_error", param=param)


@attrs.frozen
class SpeechRequest:
    """``POST /v1/audio/speech``."""

    model: str
    input: str
    voice: str
    response_format: str = "pcm"
    stream_format: str = "audio"
    speed: float = 1.0
    deadline: float | None = None


@attrs.frozen
class ChatAudio:
    """An ``input_audio`` part: the decoded file's bytes and its format."""

    data: bytes
    format: str


@attrs.frozen
class ChatMessage:
    """One message: its role, its text parts joined, its audio parts."""

    role: str
    text: str
    audio: list[ChatAudio]


@attrs.frozen
class ChatRequest:
    """``POST /v1/chat/completions``."""

    model: str
    messages: list[ChatMessage]
    modalities: list[str]
    voice: str | None = None
    audio_format: str = "pcm16"
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    deadline: float | None = None

    @property
    def wants_audio(self) -> bool:
        """Whether the answer carries audio."""
        return "audio" in self.modalities


def _field(data: dict[str, Any], name: str, kind: type | tuple[type, ...], *, at: str = "", **default: Any) -> Any:
    path = f"{at}{name}"
    if name not in data or data[name] is None:
        if "default" in default:
            return default["default"]
        raise BadRequest(f"missing required field {path!r}", param=path)
    value = data[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON true is not a number here
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise BadRequest(f"{path!r} must be {names}, got {type(value).__name__}", param=path)
    return value


def _choice(value: str, choices: tuple[str, ...], path: str) -> str:
    if value not in choices:
        raise BadRequest(f"{path!r} must be one of {list(choices)}, got {value!r}", param=path)
    return value


def _deadline(data: dict[str, Any]) -> float | None:
    deadline = _field(data, "deadline", (int, float), default=None)
    # Python's JSON reader takes NaN and Infinity, which JSON has not: neither is a number of seconds.
    if deadline is not None and not (0 < deadline < math.inf):
        raise BadRequest(f"'deadline' must be a number of seconds > 0, got {deadline}", param="deadline")
    return None if deadline is None else float(deadline)


def speech_request(data: dict[str, Any]) -> SpeechRequest:
    """Check a speech body."""
    text = _field(data, "input", str)
    if not text.strip():
        raise BadRequest("'input' is empty", param="input")
    speed = float(_field(data, "speed", (int, float), default=1.0))
    if not 0.25 <= speed <= 4.0:
        raise BadRequest(f"'speed' must be in [0.25, 4.0], got {speed}", param="speed")
    return SpeechRequest(
        model=_field(data, "model", str),
        input=text,
        voice=_field(data, "voice", str),
        response_format=_choice(_field(data, "response_format", str, default="pcm"), SPEECH_FORMATS,
                                "response_format"),
        stream_format=_choice(_field(data, "stream_format", str, default="audio"), SPEECH_STREAM_FORMATS,
                              "stream_format"),
        speed=speed,
        deadline=_deadline(data),
    )


def _message(index: int, data: Any) -> ChatMessage:
    at = f"messages[{index}]"
    if not isinstance(data, dict):
        raise BadRequest(f"{at!r} must be an object", param=at)
    role = _field(data, "role", str, at=f"{at}.")
    content = _field(data, "content", (str, list), at=f"{at}.", default="")
    if isinstance(content, str):
        return ChatMessage(role, content, [])
    texts, audio = [], []
    for j, part in enumerate(content):
        part_at = f"{at}.content[{j}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{part_at!r} must be an object", param=part_at)
        kind = _field(part, "type", str, at=f"{part_at}.")
        if kind == "text":
            texts.append(_field(part, "text", str, at=f"{part_at}."))
        elif kind == "input_audio":
            audio_part = _field(part, "input_audio", dict, at=f"{part_at}.")
            encoded = _field(audio_part, "data", str, at=f"{part_at}.input_audio.")
            fmt = _choice(_field(audio_part, "format", str, at=f"{part_at}.input_audio."), ("wav",),
                          f"{part_at}.input_audio.format")
            try:
                audio.append(ChatAudio(base64.b64decode(encoded, validate=True), fmt))
            except (binascii.Error, ValueError):
                raise BadRequest(f"'{part_at}.input_audio.data' is not base64",
                                 param=f"{part_at}.input_audio.data") from None
        else:
            raise BadRequest(f"'{part_at}.type' must be 'text' or 'input_audio', got {kind!r}",
                             param=f"{part_at}.type")
    return ChatMessage(role, "\n".join(texts), audio)


def chat_request(data: dict[str, Any]) -> ChatRequest:
    """Check a chat completion body."""
    model = _field(data, "model", str)
    raw_messages = _field(data, "messages", list)
    if not raw_messages:
        raise BadRequest("'messages' is empty", param="messages")
    messages = [_message(i, m) for i, m in enumerate(raw_messages)]
    modalities = _field(data, "modalities", list, default=["text"])
    for i, modality in enumerate(modalities):
        _choice(modality, MODALITIES, f"modalities[{i}]")
    voice, audio_format = None, "pcm16"
    if "audio" in modalities:
        audio = _field(data, "audio", dict)
        voice = _field(audio, "voice", str, at="audio.")
        audio_format = _choice(_field(audio, "format", str, at="audio."), CHAT_AUDIO_FORMATS, "audio.format")
    max_tokens = _field(data, "max_completion_tokens", int, default=None)
    if max_tokens is None:
        max_tokens = _field(data, "max_tokens", int, default=None)
    if max_tokens is not None and max_tokens < 1:
        raise BadRequest("'max_tokens' must be >= 1", param="max_tokens")
    options = _field(data, "stream_options", dict, default={})
    return ChatRequest(
        model=model,
        messages=messages,
        modalities=list(modalities),
        voice=voice,
        audio_format=audio_format,
        stream=_field(data, "stream", bool, default=False),
        include_usage=_field(options, "include_usage", bool, at="stream_options.", default=False),
        max_tokens=max_tokens,
        deadline=_deadline(data),
    )
