"""The serving benchmark's pipeline on omni-trio: talker ══frames══► vocoder ══PCM16══► caller, each stage
in a worker process of its own, and the adapter that serves it as ``POST /v1/audio/speech``.

The model code (the talker's step, the vocoder, the vocoder's hooks) is :mod:`benchmarks.serving_model`,
shared with SGLang-Omni's side; here the step runs in omni-trio's built-in
``ContinuousBatchingScheduler`` and the hooks on its ``StreamingSimpleScheduler``, as a user writes them.
SGLang-Omni has no iteration-level scheduler: its side runs the same step in the hand-written
:class:`~benchmarks.serving_model.BatchingTalker`.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

import omni_trio as ot
from benchmarks.serving_model import (
    SAMPLE_RATE,
    StepCost,
    TalkerState,
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


class Talker(ot.ContinuousBatchingScheduler):
    """The talker on omni-trio's built-in iteration-level scheduler, torch on one thread."""

    def warm_up_serving_thread(self) -> None:
        """One thread for torch, like a real model's stage."""
        torch.set_num_threads(1)


def create_talker(max_batch: int, frames: int, step_base_ms: float, step_per_request_ms: float) -> Talker:
    """The talker: :class:`TalkerStep` over the active batch, a codec frame per request per step, streamed
    to the vocoder; a request joins with ``params["frames"]`` (else ``frames``) to make and ends with
    ``{"frames": n}``."""
    step = TalkerStep(StepCost(step_base_ms, step_per_request_ms))

    def join(request: ot.BatchedRequest) -> TalkerState:
        assert request.payload is not None  # payload-driven: it joins on its payload
        return TalkerState(request.request_id, int(request.payload.request.params.get("frames", frames)))

    def step_batch(batch: list[ot.BatchedRequest]) -> list[ot.StepOutput]:
        outputs = []
        for request, frame in zip(batch, step([request.state for request in batch]), strict=True):
            if request.state.done:
                request.payload.data = {"frames": request.state.made}
            outputs.append(ot.StepOutput(chunk=frame, done=request.state.done))
        return outputs

    return Talker(step_batch, max_batch_size=max_batch, join_fn=join)


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
