"""The voice pipeline (real ASR and TTS) behind ``omni-trio serve``: speech in and out over HTTP and WebSocket.

::

                 ┌──► responder ──► tts (espeak-ng) ══PCM══► caller      answers and speech
    asr ─route───┤
                 └──► transcriber (a session stage: streaming ASR)        transcriptions, realtime turns

``POST /v1/audio/speech`` and ``/v1/audio/speech/stream`` speak the given
text as it is (``params["task"] = "speak"``); a realtime turn and a chat are
answered by the responder (it repeats the user's words). Transcriptions and the
realtime API's input audio go to the ``transcriber`` session stage, which
streams each changed partial transcript. A plain request with
``params["task"] = "transcribe"`` goes asr -> transcriber and returns
``{"transcript", "heard_s"}``.

Run from the repository root::

    omni-trio serve examples/omni_speech/serve_voice.toml --port 8000
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import soxr

import omni_trio as ot
from examples.omni_speech import asr, tts, voice
from examples.placement import process_for
from omni_trio.serve import ChatRequest, Completion, Delta, PipelineInput, ServeAdapter, SpeechRequest
from omni_trio.serve.adapter import ResponseSettings, Transcript

M = "examples.omni_speech"
#: The worker process of each stage in the ``processes`` placement.
PROCESS_OF = {"asr": "p_asr", "responder": "p_asr", "tts": "p_tts", "transcriber": "p_listen"}
#: OpenAI's voice names; each speaks with espeak-ng's default voice (any other name is an espeak-ng voice).
OPENAI_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "marin", "cedar", "nova", "onyx",
                           "sage", "shimmer", "verse"})


def route_after_asr(request_id: str, payload: ot.StagePayload) -> str:
    """``route_fn`` of ``asr``: transcription requests end at the transcriber, the others are answered."""
    return "transcriber" if payload.request.params.get("task") == "transcribe" else "responder"


def expected_terminals(request: ot.OmniRequest) -> list[str]:
    """``terminal_stages_fn``: where a request ends (the route :func:`route_after_asr` takes)."""
    return ["transcriber"] if request.params.get("task") == "transcribe" else ["tts"]


def respond(payload: ot.StagePayload) -> ot.StagePayload:
    """The text to speak: the request's own words (``task = "speak"``) or the responder's answer to them."""
    transcript = payload.data["transcript"]
    speak = payload.request.params.get("task") == "speak"
    payload.data = {**payload.data, "text": transcript if speak else voice.answer(transcript)}
    return payload


def create_responder() -> ot.SimpleScheduler:
    """The responder stage (deterministic, no model)."""
    return ot.SimpleScheduler(respond)


def transcribed(payload: ot.StagePayload) -> ot.StagePayload:
    """The transcriber's answer to a plain request: the ASR's ``{"transcript", "heard_s"}`` as it is."""
    return payload


def create_transcriber(max_open_sessions: int = 64) -> ot.SessionScheduler:
    """The streaming ASR session stage (one recognizer per session), which also ends transcription requests."""
    return ot.SessionScheduler(asr.StreamingRecognizer(asr.DecoderPool()), compute_fn=transcribed,
                               max_open_sessions=max_open_sessions, max_concurrency=8)


def make_serve_voice_config(placement: str = "embedded", *, model: str = "omni-voice") -> ot.PipelineConfig:
    """The served voice pipeline (as serve_voice.toml), placed by ``placement`` (``embedded`` or ``processes``)."""

    def stage(name: str, factory: str, **fields: Any) -> ot.StageConfig:
        return ot.StageConfig(name=name, factory_path=f"{M}.{factory}",
                              process=process_for(placement, PROCESS_OF[name]), **fields)

    return ot.PipelineConfig(
        name="omni_voice",
        entry_stage="asr",
        max_in_flight=64,
        terminal_stages_fn=f"{M}.serve_voice.expected_terminals",
        stages=[
            stage("asr", "asr.create_asr", next=["responder", "transcriber"],
                  route_fn=f"{M}.serve_voice.route_after_asr"),
            stage("responder", "serve_voice.create_responder", next="tts"),
            stage("tts", "tts.create_tts", terminal=True),
            stage("transcriber", "serve_voice.create_transcriber", terminal=True),
        ],
        serve=ot.ServeConfig(model=model, adapter=f"{M}.serve_voice.VoiceAdapter"),
    )


def espeak_voice(name: str | None) -> str:
    """The espeak-ng voice for a requested voice name."""
    return tts.DEFAULT_VOICE if name is None or name in OPENAI_VOICES else name


class VoiceAdapter(ServeAdapter):
    """HTTP and WebSocket <-> the voice pipeline; audio out is PCM16 at 24 kHz (espeak's 22.05 kHz, resampled)."""

    sample_rate = 24_000
    transcription_stages = ("transcriber",)

    def speech_input(self, request: SpeechRequest) -> PipelineInput:
        """Speak the text as it is, in ``voice`` (an OpenAI name: espeak-ng's default voice) at ``speed``."""
        return PipelineInput(request.input, {"task": "speak", "voice": espeak_voice(request.voice),
                                             "speed": request.speed})

    def chat_input(self, request: ChatRequest) -> PipelineInput:
        """The last user message's text, answered by the responder."""
        given = super().chat_input(request)
        return attrs.evolve(given, params={"voice": espeak_voice(request.voice)})

    def transcription_chunk(self, pcm: bytes, sample_rate: int) -> Any:
        """The transcriber's chunk form: samples and their rate."""
        return {"pcm": np.frombuffer(pcm, dtype="<i2").copy(), "sample_rate": sample_rate}

    def transcription_end(self, sample_rate: int) -> Any:
        """An empty chunk ends the transcriber's utterance."""
        return {"pcm": np.zeros(0, dtype=np.int16), "sample_rate": sample_rate}

    def transcript(self, event: ot.StreamMessage) -> Transcript | None:
        """The transcriber's chunks: ``{"data": transcript so far, "final": ...}``."""
        chunk = event.chunk
        if isinstance(chunk, dict) and isinstance(chunk.get("data"), str):
            return Transcript(chunk["data"], bool(chunk.get("final")))
        return None

    def response_input(self, transcript: str, settings: ResponseSettings) -> PipelineInput:
        """The user's words, answered by the responder, spoken in the session's voice."""
        return PipelineInput(transcript, {"voice": espeak_voice(settings.voice)})

    def delta(self, event: ot.StreamMessage) -> Delta:
        """A TTS chunk (float32 at 22.05 kHz) as PCM16 at 24 kHz.

        Each ~100 ms chunk is resampled on its own (soxr, high quality), so no
        state is kept per request; the edges of a chunk are filtered with zero
        padding, which is below what the ASR or a listener notices.
        """
        chunk = event.chunk
        if event.modality != "audio" or not isinstance(chunk, dict):
            return Delta()
        samples = chunk["pcm"].numpy()
        resampled = soxr.resample(samples, int(chunk["sample_rate"]), self.sample_rate, quality="HQ")
        return Delta(audio=(np.clip(resampled, -1.0, 32767 / 32768) * 32768.0).round().astype("<i2").tobytes())

    def completion(self, result: Any) -> Completion:
        """The spoken text is the answer's text (and its audio's transcript)."""
        return Completion(str(result.get("text", "")) if isinstance(result, dict) else "")
