"""A served voice pipeline (examples/omni_speech/serve_voice.py) on a trio loop in a thread, for a test module.

The official openai client's realtime connection runs on asyncio (the
``websockets`` package), so the tests are synchronous and run their client
with ``asyncio.run`` while the server runs its own ``trio.run`` here.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

import attrs
import numpy as np
import openai
import soxr

import omni_trio as ot
from examples.omni_speech.serve_voice import make_serve_voice_config
from examples.omni_speech.voice import spoken
from omni_trio.serve.limits import SocketLimits
from tests.serve.threaded_server import ThreadServer, server_in_thread

T = TypeVar("T")
MODEL = "omni-voice"
CHUNK = 24_000 * 2 // 10  # 100 ms of PCM16 at 24 kHz


#: The served voice pipeline (see :mod:`tests.serve.threaded_server`).
VoiceServer = ThreadServer


@contextlib.contextmanager
def voice_server(placement: str = "embedded", limits: SocketLimits | None = None,
                 admission: ot.StreamAdmissionConfig | None = None) -> Iterator[VoiceServer]:
    """Serve the voice pipeline with ``ot.serve_http`` on a free port until the block ends (``admission``:
    its stream admission, the default's otherwise)."""
    config = make_serve_voice_config(placement, model=MODEL)
    if admission is not None:
        config = attrs.evolve(config, stream_admission=admission)
    with server_in_thread(config, VoiceServer, f"voice server ({placement})", limits=limits) as server:
        yield server


def speech_pcm16(text: str, rate: int = 24_000) -> bytes:
    """``text`` spoken by espeak-ng, as PCM16 mono bytes at ``rate``."""
    samples, espeak_rate = spoken(text)
    floats = soxr.resample(samples.astype(np.float32) / 32768.0, espeak_rate, rate, quality="HQ")
    return (np.clip(floats, -1.0, 32767 / 32768) * 32768.0).round().astype("<i2").tobytes()


def words(text: str) -> set[str]:
    """The lower-case words of ``text``."""
    return {w.strip(".,!?").lower() for w in text.split()} - {""}


def silence(seconds: float) -> bytes:
    """``seconds`` of PCM16 silence at 24 kHz."""
    return b"\0\0" * int(24_000 * seconds)


def realtime_client(ws_url: str) -> openai.AsyncOpenAI:
    """The official client, its realtime connection aimed at ``ws_url`` (``ws://HOST:PORT/v1``)."""
    return openai.AsyncOpenAI(api_key="unused", websocket_base_url=ws_url, max_retries=0)


async def until(connection: Any, kind: str, seen: list[Any]) -> Any:
    """Read server events into ``seen`` up to the first of type ``kind``, and return it."""
    async for event in connection:
        seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"the connection closed before {kind}")


async def send_audio(connection: Any, pcm: bytes) -> None:
    """Append ``pcm`` (PCM16 at 24 kHz) to the input audio buffer in 100 ms pieces."""
    for start in range(0, len(pcm), CHUNK):
        await connection.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + CHUNK]).decode())
