"""The adapter contract: how HTTP requests become pipeline requests and back.

A pipeline's ``serve.adapter`` names a :class:`ServeAdapter` subclass. The
server builds it once with ``serve.adapter_options`` and calls it on the
event loop for every request, so its methods must be quick and must not block.

Speech in (``/v1/audio/transcriptions``, ``/v1/realtime``) goes through a
*transcription session*: a pipeline session (docs/sessions.md) at the
adapter's :attr:`ServeAdapter.transcription_stages`, fed the client's audio
with :meth:`~ServeAdapter.transcription_chunk` and ended, utterance by
utterance, with :meth:`~ServeAdapter.transcription_end`; its stream chunks are
read with :meth:`~ServeAdapter.transcript`. A realtime turn's answer is an
ordinary pipeline request made by :meth:`~ServeAdapter.response_input` from the
turn's transcript; its chunks become audio and text with :meth:`~ServeAdapter.delta`.
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


@attrs.frozen
class Transcript:
    """What a transcription session's chunk says: the utterance's whole transcript so far, and whether it is
    the final one (the answer to :meth:`ServeAdapter.transcription_end`)."""

    text: str
    final: bool = False


@attrs.frozen
class ResponseSettings:
    """How a realtime session wants its answers: ``voice`` (None: the adapter's default), the session's
    ``instructions``, and whether it wants audio (``False``: text only)."""

    voice: str | None = None
    instructions: str = ""
    audio: bool = True


class ServeAdapter:
    """Base class of adapters; subclasses override what their pipeline needs.

    ``sample_rate`` is the rate of the PCM that :meth:`delta` returns.
    """

    sample_rate: int = 24_000
    #: The owner stages of a transcription session; empty: the pipeline does not take speech in
    #: (``/v1/audio/transcriptions`` and ``/v1/realtime`` then answer that the model does not transcribe).
    transcription_stages: tuple[str, ...] = ()

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

    def transcription_chunk(self, pcm: bytes, sample_rate: int) -> Any:
        """The chunk appended to a transcription session for ``pcm`` (PCM16 little-endian mono at ``sample_rate``)."""
        raise NotImplementedError(f"{type(self).__name__} does not transcribe (no transcription_stages)")

    def transcription_end(self, sample_rate: int) -> Any:
        """The chunk that ends an utterance: its append must emit the final :class:`Transcript`."""
        raise NotImplementedError(f"{type(self).__name__} does not transcribe (no transcription_stages)")

    def transcript(self, event: StreamMessage) -> Transcript | None:
        """A transcription session's stream chunk as a :class:`Transcript` (None: not one)."""
        return None

    def response_input(self, transcript: str, settings: ResponseSettings) -> PipelineInput:
        """A realtime turn's answer: by default the user's transcript is the pipeline's input."""
        return PipelineInput(transcript)
