"""The omni_speech pipeline behind ``omni-trio serve`` (see examples/omni_speech/serve.toml).

:class:`SpeechAdapter` turns an OpenAI speech or chat request into the
pipeline's text and ``params``, and the vocoder's float32 PCM chunks into
PCM16 audio deltas at 16 kHz. The thinker's text is the answer's text and the
audio's transcript. ``voice`` picks one of the vocoder's voices
(:data:`~examples.omni_speech.models.VOICES`; another name is a 400 naming
``voice``, or ``audio.voice`` in a chat) and ``speed`` scales how long the
audio lasts (each codec frame becomes ``320 / speed`` samples, the pitch
stays); both travel as the pipeline's ``params``.
"""

from __future__ import annotations

from typing import Any

from examples.omni_speech import models
from omni_trio import StreamMessage
from omni_trio.serve import (
    ChatRequest,
    Completion,
    Delta,
    PipelineInput,
    ServeAdapter,
    SpeechRequest,
    decode_wav,
    pcm16,
    resample,
)
from omni_trio.serve.schemas import BadRequest


class SpeechAdapter(ServeAdapter):
    """HTTP <-> the omni_speech pipeline; ``max_new_tokens`` is the answer length when the client sets none."""

    sample_rate = models.SAMPLE_RATE

    def __init__(self, max_new_tokens: int = 24, max_tokens_limit: int = 256) -> None:
        self.max_new_tokens = max_new_tokens
        self.max_tokens_limit = max_tokens_limit

    def speech_input(self, request: SpeechRequest) -> PipelineInput:
        """The text to speak is the prompt, spoken in ``voice`` at ``speed``."""
        params = {"max_new_tokens": self.max_new_tokens, **_voice(request.voice, request.speed, "voice")}
        return PipelineInput(request.input, params)

    def chat_input(self, request: ChatRequest) -> PipelineInput:
        """The last user message: its text, and its audio (a WAV, resampled to 16 kHz)."""
        users = [m for m in request.messages if m.role == "user"]
        if not users:
            raise BadRequest("the conversation has no user message", param="messages")
        message = users[-1]
        index = request.messages.index(message)
        text = message.text if message.text.strip() else "(audio)"
        tokens = request.max_tokens or self.max_new_tokens
        if tokens > self.max_tokens_limit:
            raise BadRequest(f"'max_tokens' must be at most {self.max_tokens_limit}", param="max_tokens")
        params: dict[str, Any] = {"max_new_tokens": tokens}
        if request.wants_audio and request.voice is not None:
            params.update(_voice(request.voice, 1.0, "audio.voice"))
        if message.audio:
            try:
                samples, rate = decode_wav(message.audio[0].data)
            except Exception as exc:  # noqa: BLE001 - whatever a bad file raises, the client hears why
                raise BadRequest(f"input_audio is not a PCM16 WAV file: {exc}", param=f"messages[{index}]") from None
            if samples.numel() == 0:
                raise BadRequest("input_audio holds no samples", param=f"messages[{index}]")
            params["audio_pcm"] = resample(samples, rate, models.SAMPLE_RATE)
        return PipelineInput(text, params)

    def delta(self, event: StreamMessage) -> Delta:
        """A vocoder chunk (20 ms of float32 PCM) as PCM16 bytes."""
        if event.modality == "audio":
            return Delta(audio=pcm16(event.chunk))
        return Delta()

    def completion(self, result: Any) -> Completion:
        """The thinker's answer is the text; its tokens are the usage (the prompt is not counted)."""
        return Completion(result["text"], output_tokens=int(result["tokens"]))


def _voice(voice: str, speed: float, param: str) -> dict[str, Any]:
    """The pipeline params for ``voice`` and ``speed``; an unknown voice is a 400 naming ``param``."""
    if voice not in models.VOICES:
        raise BadRequest(f"unknown voice {voice!r}; this model speaks with {', '.join(models.VOICES)}", param=param)
    return {"voice": voice, "speed": speed}
