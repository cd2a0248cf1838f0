"""The serving benchmark's pipeline on omni-trio: talker ══frames══► vocoder ══PCM16══► caller, each stage
in a worker process of its own, and the adapter that serves it as ``POST /v1/audio/speech``.

The model code (the step, the vocoder, the talker's scheduler, the vocoder's hooks) is
:mod:`benchmarks.serving_model`, shared with SGLang-Omni's side; here it is wired to omni-trio's
``Inbox``/``Outbox`` and ``StreamingSimpleScheduler``, as a user writes it today.
"""

from __future__ import annotations

from typing import Any

import attrs

import omni_trio as ot
from benchmarks.serving_model import (
    SAMPLE_RATE,
    BatchingTalker,
    StepCost,
    TalkerStep,
    VocoderHooks,
    VocoderModel,
)
from omni_trio.serve import Completion, Delta, PipelineInput, ServeAdapter, SpeechRequest

M = "benchmarks.serving_stages"
MODEL = "omni-trio-serving-bench"


@attrs.frozen
class PipelineShape:
    """The knobs of the benchmark's pipeline, the same on both runtimes."""

    max_batch: int = 32
    frames: int = 40  # codec frames per utterance: 40 x 80 ms = 3.2 s of audio
    step_base_ms: float = 10.0
    step_per_request_ms: float = 0.5
    max_in_flight: int | None = 64

    def factory_options(self) -> dict[str, Any]:
        """The talker factory's keyword arguments."""
        return {"max_batch": self.max_batch, "frames": self.frames, "step_base_ms": self.step_base_ms,
                "step_per_request_ms": self.step_per_request_ms}


def create_talker(max_batch: int, frames: int, step_base_ms: float, step_per_request_ms: float) -> BatchingTalker:
    """The talker: :class:`BatchingTalker` over :class:`TalkerStep`, with omni-trio's queues (the
    ``Outbox`` wakes the stage's drain itself; the ``Inbox`` returns a chunk's credit when it is taken)."""
    step = TalkerStep(StepCost(step_base_ms, step_per_request_ms))
    return BatchingTalker(step, max_batch, frames, inbox=ot.Inbox(), outbox=ot.Outbox(),
                          incoming=ot.IncomingMessage, outgoing=ot.OutgoingMessage)


class Vocoder(VocoderHooks, ot.StreamingSimpleScheduler):
    """The vocoder's hooks on omni-trio's ``StreamingSimpleScheduler``."""


def create_vocoder() -> Vocoder:
    """Frames in (stream), PCM16 chunks out to the caller (stream)."""
    return Vocoder(VocoderModel(), ot.OutgoingMessage)


def make_config(shape: PipelineShape, *, serve: bool = False) -> ot.PipelineConfig:
    """talker -> vocoder, a worker process each; with ``serve``, the ``[serve]`` table of
    :class:`SpeechAdapter`."""
    return ot.PipelineConfig(
        name="serving-bench",
        entry_stage="talker",
        max_in_flight=shape.max_in_flight,
        stages=[
            ot.StageConfig(name="talker", factory_path=f"{M}.create_talker", factory=shape.factory_options(),
                           process="p_talker", next="vocoder", stream_to=["vocoder"]),
            ot.StageConfig(name="vocoder", factory_path=f"{M}.create_vocoder", process="p_vocoder",
                           terminal=True, can_accept_stream_before_payload=True),
        ],
        serve=ot.ServeConfig(model=MODEL, adapter=f"{M}.SpeechAdapter",
                             adapter_options={"frames": shape.frames}) if serve else None,
    )


class SpeechAdapter(ServeAdapter):
    """``POST /v1/audio/speech`` <-> the benchmark's pipeline: the input is the text, ``frames`` the
    utterance's length, and each vocoder chunk is already PCM16 bytes at 24 kHz."""

    sample_rate = SAMPLE_RATE

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def speech_input(self, request: SpeechRequest) -> PipelineInput:
        """The text, with the utterance's length in frames."""
        return PipelineInput(request.input, {"frames": self.frames})

    def delta(self, event: ot.StreamMessage) -> Delta:
        """A PCM16 chunk as it is."""
        return Delta(audio=event.chunk) if event.modality == "audio" else Delta()

    def completion(self, result: Any) -> Completion:
        """No text: the answer is its audio."""
        return Completion("")
