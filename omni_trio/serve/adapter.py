"""The adapter contract: how HTTP requests become pipeline requests and back.

A pipeline's ``serve.adapter`` names a :class:`ServeAdapter` subclass. The
server builds it once with ``serve.adapter_options`` and calls it on the
event loop for every request, so its methods must be quick and must not block.
"""

from __future__ import annotations

from typing import Any

import attrs

from omni_trio.events import StreamMessage
from omni_trio.serve.schemas import ChatRequest, SpeechRequest


@attrs.frozen
class PipelineInput:
    """What one HTTP request submits: the pipeline's ``inputs`` and ``params``."""

    inputs: Any
    params: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Delta:
    """A piece of the answer: text, and audio as PCM16 little-endian mono bytes."""

    text: str = ""
    audio: bytes = b""


@attrs.frozen
class Completion:
    """The end of an answer: the full text (the transcript of the audio too) and token counts."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0


class ServeAdapter:
    """Base class of adapters; subclasses override what their pipeline needs.

    ``sample_rate`` is the rate of the PCM that :meth:`delta` returns.
    """

    sample_rate: int = 24_000

    def speech_input(self, request: SpeechRequest) -> PipelineInput:
        """``POST /v1/audio/speech``: the text to speak becomes the pipeline's input."""
        return PipelineInput(request.input)

    def chat_input(self, request: ChatRequest) -> PipelineInput:
        """``POST /v1/chat/completions``: by default the last user message's text."""
        users = [m for m in request.messages if m.role == "user"] or request.messages
        return PipelineInput(users[-1].text)

    def delta(self, event: StreamMessage) -> Delta:
        """One stream chunk of the pipeline as a piece of the answer (empty: nothing to send)."""
        if isinstance(event.chunk, str):
            return Delta(text=event.chunk)
        return Delta()

    def completion(self, result: Any) -> Completion:
        """The pipeline's result as the end of the answer."""
        return Completion(result if isinstance(result, str) else "")
