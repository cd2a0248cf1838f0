"""A spoken exchange with real models: audio in -> ASR -> a responder -> espeak-ng voice out.

::

    asr (pocketsphinx) ──► responder ──► tts (espeak-ng) ══PCM══► caller
                                                          (stream)

The responder is small and deterministic (no model): it answers with the
words it was given. The request's audio is ``params["audio_pcm"]`` at
``params["sample_rate"]`` (any rate: the ASR stage resamples it); a request
without audio is typed text and skips recognition.

Run from the repository root::

    python -m examples.omni_speech.voice --say "please open the door" --out out/voice.wav
    python -m examples.omni_speech.voice --wav question.wav --placement processes

Without ``--wav`` the user's audio is ``--say`` spoken by espeak-ng (at its
22.05 kHz), so nothing needs a microphone.
"""

from __future__ import annotations

import argparse
import time
import wave
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

import omni_trio as ot
from examples.omni_speech import espeak, tts
from examples.omni_speech.pipeline import PLACEMENTS, exit_after, run_demo, write_wav
from examples.placement import process_for

M = "examples.omni_speech"
#: The worker process of each stage in the ``processes`` placement.
PROCESS_OF = {"asr": "p_asr", "responder": "p_asr", "tts": "p_tts"}


def answer(transcript: str) -> str:
    """The responder's reply: built from the words the user said."""
    words = transcript.split()
    if not words:
        return "I did not hear anything. Please say that again."
    longest = max(words, key=len)
    return f"You said: {transcript}. That is {len(words)} words, and the longest is {longest}."


def respond(payload: ot.StagePayload) -> ot.StagePayload:
    """``{"transcript"}`` -> ``{"transcript", "text"}``: the text is the answer to speak."""
    transcript = payload.data["transcript"]
    payload.data = {**payload.data, "text": answer(transcript)}
    return payload


def create_responder() -> ot.SimpleScheduler:
    """The "thinker" of this pipeline: deterministic, and it answers with the user's words."""
    return ot.SimpleScheduler(respond)


def make_voice_config(placement: str = "embedded", *, base_path: str | None = None) -> ot.PipelineConfig:
    """The spoken-exchange pipeline, placed by ``placement`` (``embedded`` or ``processes``)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")

    def stage(name: str, factory: str, **fields: Any) -> ot.StageConfig:
        return ot.StageConfig(name=name, factory_path=f"{M}.{factory}",
                              process=process_for(placement, PROCESS_OF[name]), **fields)

    return ot.PipelineConfig(
        entry_stage="asr",
        stages=[
            stage("asr", "asr.create_asr", next="responder"),
            stage("responder", "voice.create_responder", next="tts"),
            stage("tts", "tts.create_tts", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base_path),
    )


def spoken(text: str, **voice: Any) -> tuple[np.ndarray, int]:
    """``text`` spoken by espeak-ng (the pipeline's own voice settings unless ``voice`` says otherwise):
    int16 samples and their rate."""
    options = {"words_per_minute": tts.WORDS_PER_MINUTE, "word_gap_ms": tts.WORD_GAP_MS, **voice}
    chunks: list[np.ndarray] = []

    def keep(samples: np.ndarray) -> bool:
        chunks.append(samples)
        return True

    espeak.synthesize(text, keep, **options)
    return np.concatenate(chunks), espeak.sample_rate()


@attrs.define
class Exchange:
    """One request through the voice pipeline: the PCM chunks as they came, and the result."""

    request_id: str
    started_ns: int
    chunks: list[torch.Tensor] = attrs.Factory(list)
    chunk_ns: list[int] = attrs.Factory(list)
    sample_rate: int = 0
    result: dict[str, Any] | None = None
    finished_ns: int = 0

    @property
    def pcm(self) -> torch.Tensor:
        """All the reply's samples, float32."""
        return torch.cat(self.chunks) if self.chunks else torch.zeros(0)

    @property
    def time_to_first_audio_s(self) -> float:
        return (self.chunk_ns[0] - self.started_ns) / 1e9

    @property
    def wall_s(self) -> float:
        return (self.finished_ns - self.started_ns) / 1e9


async def converse(pipeline: ot.Pipeline, request_id: str, audio: Any = None, sample_rate: int = 16_000,
                   text: str = "") -> Exchange:
    """Send ``audio`` (samples at ``sample_rate``) or typed ``text``; collect the spoken reply."""
    params: dict[str, Any] = {}
    if audio is not None:
        params = {"audio_pcm": np.asarray(audio), "sample_rate": sample_rate}
    exchange = Exchange(request_id, time.time_ns())
    async with pipeline.stream(request_id, text, params=params) as events:
        async for event in events:
            if isinstance(event, ot.StreamMessage):
                exchange.chunk_ns.append(time.time_ns())
                exchange.chunks.append(event.chunk["pcm"])
                exchange.sample_rate = int(event.chunk["sample_rate"])
            elif isinstance(event, ot.CompleteMessage):
                exchange.result = event.result
    exchange.finished_ns = time.time_ns()
    return exchange


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A mono 16-bit WAV file's samples and rate."""
    with wave.open(str(path), "rb") as source:
        if source.getsampwidth() != 2 or source.getnchannels() != 1:
            raise SystemExit(f"{path}: need a mono 16-bit PCM WAV file")
        return np.frombuffer(source.readframes(source.getnframes()), dtype="<i2"), source.getframerate()


async def run(args: argparse.Namespace) -> Exchange:
    """Open the pipeline and send one spoken request."""
    audio, rate = read_wav(args.wav) if args.wav else spoken(args.say)
    print(f"you ({len(audio) / rate:.2f} s at {rate} Hz): {args.say if not args.wav else args.wav}")
    async with ot.open_pipeline(make_voice_config(args.placement)) as pipeline:
        return await converse(pipeline, "voice-0", audio, rate)


def main() -> None:
    """Parse the options, run, print what was heard and answered."""
    parser = argparse.ArgumentParser(prog="python -m examples.omni_speech.voice", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--say", default="please open the door", help="what the user says (spoken by espeak-ng)")
    parser.add_argument("--wav", type=Path, help="the user's audio instead: a mono 16-bit WAV file, any rate")
    parser.add_argument("--placement", choices=PLACEMENTS, default="embedded")
    parser.add_argument("--out", type=Path, help="write the spoken reply to this WAV file")
    args = parser.parse_args()
    exchange = run_demo(run, args)  # Ctrl-C: one line, exit 130
    result = exchange.result or {}
    print(f"heard: {result.get('transcript')!r}")
    print(f"reply: {result.get('text')!r}")
    audio_s = exchange.pcm.numel() / max(exchange.sample_rate, 1)
    print(f"{len(exchange.chunks)} audio chunks ({audio_s:.2f} s at {exchange.sample_rate} Hz); first audio after "
          f"{exchange.time_to_first_audio_s * 1000:.0f} ms, done in {exchange.wall_s * 1000:.0f} ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_wav(args.out, exchange.pcm, exchange.sample_rate)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    exit_after(main)
