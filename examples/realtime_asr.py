"""A realtime, streaming-ASR-shaped session: audio chunks in, partial transcripts out.

The "model" is a toy that runs on CPU in microseconds: each letter of the
spoken text is a 50 ms sine tone whose pitch encodes the letter (``a`` at
200 Hz, then 40 Hz a letter), and the recogniser counts the zero crossings
of each 50 ms frame to get the letter back. What is real is the shape: a
session per speaker holds the recogniser's state (the samples of a frame not
yet complete, the transcript so far), every append feeds one chunk of PCM (a
torch tensor) and streams the partial transcript, and closing the session
releases its state.

``--model pocketsphinx`` swaps the toy for a real recogniser
(:func:`examples.omni_speech.asr.create_asr_sessions`, pocketsphinx's bundled
en-us model) and the letter tones for a sentence spoken by espeak-ng at its
22.05 kHz: the same session shape, partial transcripts as the words form,
and an empty chunk at the end for the final transcript.

Run: ``python -m examples.realtime_asr [--placement embedded|processes|mixed] [--model toy|pocketsphinx]``.
"""

from __future__ import annotations

import argparse
import math
import string
from typing import Any

import torch
import trio

import omni_trio as ot
from examples.omni_speech.voice import spoken
from examples.placement import PLACEMENTS, process_for

SAMPLE_RATE = 16_000
FRAME = SAMPLE_RATE // 20  # 50 ms of audio carries one letter
CHUNK = 2 * FRAME + FRAME // 2  # the client sends 125 ms chunks: frames straddle chunk boundaries
BASE_HZ, STEP_HZ = 200.0, 40.0


def speak(text: str) -> torch.Tensor:
    """The PCM (float32, 16 kHz) of ``text``: one tone per letter, silence for a space."""
    t = torch.arange(FRAME, dtype=torch.float64) / SAMPLE_RATE
    frames = []
    for char in text:
        if char == " ":
            frames.append(torch.zeros(FRAME, dtype=torch.float64))
        else:
            hz = BASE_HZ + STEP_HZ * string.ascii_lowercase.index(char)
            frames.append(torch.sin(2 * math.pi * hz * t + 0.5))  # the phase keeps samples off zero
    return torch.cat(frames).to(torch.float32)


def recognise(frame: torch.Tensor) -> str:
    """One 50 ms frame back to its letter (a space for silence)."""
    if float(frame.abs().max()) < 1e-3:
        return " "
    crossings = int((torch.signbit(frame[1:]) != torch.signbit(frame[:-1])).sum())
    hz = crossings * SAMPLE_RATE / (2 * FRAME)
    return string.ascii_lowercase[round((hz - BASE_HZ) / STEP_HZ)]


class StreamingRecogniser:
    """The session hooks: per session, the samples of the unfinished frame and the transcript so far."""

    def __init__(self) -> None:
        self.pending: dict[str, torch.Tensor] = {}
        self.text: dict[str, str] = {}

    def open(self, session_id: str, request: ot.OmniRequest) -> None:
        self.pending[session_id] = torch.zeros(0)
        self.text[session_id] = ""

    def append(self, chunk: torch.Tensor, payload: ot.StagePayload, context: ot.SessionContext) -> ot.StagePayload:
        samples = torch.cat([self.pending[context.session_id], chunk])
        whole = len(samples) // FRAME * FRAME
        self.pending[context.session_id] = samples[whole:].clone()
        heard = "".join(recognise(frame) for frame in samples[:whole].split(FRAME))
        if heard and not context.cancelled.is_set():
            self.text[context.session_id] += heard
            end_ms = 1000.0 * len(self.text[context.session_id]) * FRAME / SAMPLE_RATE
            context.emit(ot.TimedChunk(self.text[context.session_id], end_ms=end_ms))
        payload.data = {"transcript": self.text[context.session_id]}
        return payload

    def close(self, session_id: str) -> None:
        self.pending.pop(session_id, None)
        self.text.pop(session_id, None)

    def state_bytes(self, session_id: str) -> int:
        pending = self.pending.get(session_id)
        return 0 if pending is None else pending.numel() * pending.element_size()


def create_asr(max_open_sessions: int = 16) -> ot.SessionScheduler:
    """The ASR stage: one session per speaker."""
    return ot.SessionScheduler(StreamingRecogniser(), max_open_sessions=max_open_sessions)


#: The ASR stage's factory for each ``--model``.
MODELS = {"toy": "examples.realtime_asr.create_asr", "pocketsphinx": "examples.omni_speech.asr.create_asr_sessions"}


def make_config(placement: str = "embedded", model: str = "toy") -> ot.PipelineConfig:
    """A single ASR stage (``model``: one of :data:`MODELS`), terminal: its partial transcripts stream to the caller."""
    return ot.PipelineConfig(stages=[
        ot.StageConfig(name="asr", process=process_for(placement, "p_asr"), factory_path=MODELS[model], terminal=True),
    ])


async def transcribe(pipeline: Any, speaker: str, text: str) -> list[str]:
    """Stream ``text``'s audio in chunks through one session; return the partial transcripts."""
    audio = speak(text)
    partials: list[str] = []
    async with pipeline.session(speaker, stages=["asr"]) as session, trio.open_nursery() as nursery:

        async def microphone() -> None:
            for chunk in audio.split(CHUNK):
                await session.append(chunk)
            await session.close()  # ends session.events()

        nursery.start_soon(microphone)
        async for event in session.events():
            if isinstance(event, ot.StreamMessage):
                partials.append(event.chunk["data"])
    return partials


async def transcribe_speech(pipeline: Any, speaker: str, audio: Any, sample_rate: int) -> list[dict[str, Any]]:
    """Stream real speech (samples at ``sample_rate``) in 125 ms chunks through one session of the
    pocketsphinx stage, then an empty chunk; return the emitted chunks (the last is final)."""
    step = sample_rate // 8
    emitted: list[dict[str, Any]] = []
    async with pipeline.session(speaker, stages=["asr"]) as session, trio.open_nursery() as nursery:

        async def microphone() -> None:
            for start in range(0, len(audio), step):
                await session.append({"pcm": audio[start:start + step], "sample_rate": sample_rate})
            await session.append({"pcm": audio[:0], "sample_rate": sample_rate})  # end of speech
            await session.close()

        nursery.start_soon(microphone)
        async for event in session.events():
            if isinstance(event, ot.StreamMessage):
                emitted.append(event.chunk)
    return emitted


async def main(placement: str, model: str) -> None:
    async with ot.open_pipeline(make_config(placement, model)) as pipeline:
        if model == "toy":
            for partial in await transcribe(pipeline, "speaker-1", "hello omni"):
                print(repr(partial))
            return
        audio, rate = spoken("please turn on the light in the kitchen")
        for chunk in await transcribe_speech(pipeline, "speaker-1", audio, rate):
            print(("final: " if chunk["final"] else "") + repr(chunk["data"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--placement", choices=PLACEMENTS, default="embedded")
    parser.add_argument("--model", choices=list(MODELS), default="toy")
    args = parser.parse_args()
    trio.run(main, args.placement, args.model)
