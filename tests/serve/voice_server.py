"""A served voice pipeline (examples/omni_speech/serve_voice.py) on a trio loop in a thread, for a test module.

The official openai client's realtime connection runs on asyncio (the
``websockets`` package), so the tests are synchronous and run their client
with ``asyncio.run`` while the server runs its own ``trio.run`` here.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import numpy as np
import openai
import soxr
import trio

import omni_trio as ot
from examples.omni_speech.serve_voice import make_serve_voice_config
from examples.omni_speech.voice import spoken
from omni_trio.serve.limits import SocketLimits

T = TypeVar("T")
MODEL = "omni-voice"
CHUNK = 24_000 * 2 // 10  # 100 ms of PCM16 at 24 kHz


@attrs.define
class VoiceServer:
    """The running server: its URL, and a way into its loop."""

    url: str
    pipeline: ot.Pipeline
    token: trio.lowlevel.TrioToken

    @property
    def ws_url(self) -> str:
        """The WebSocket base URL of the OpenAI API (``.../v1``)."""
        return self.url.replace("http://", "ws://") + "/v1"

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the server's loop, from a test's thread."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)


@contextlib.contextmanager
def voice_server(placement: str = "embedded", limits: SocketLimits | None = None) -> Iterator[VoiceServer]:
    """Serve the voice pipeline with ``ot.serve_http`` on a free port until the block ends."""
    config = make_serve_voice_config(placement, model=MODEL)
    started = threading.Event()
    stop: list[trio.Event] = []
    server: list[VoiceServer] = []
    failure: list[BaseException] = []

    async def main() -> None:
        with trio.fail_after(600):  # the whole module's tests
            async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                address = await nursery.start(
                    functools.partial(ot.serve_http, pipeline, config, "127.0.0.1", 0, limits=limits))
                stop.append(trio.Event())
                server.append(VoiceServer(address.url, pipeline, trio.lowlevel.current_trio_token()))
                started.set()
                await stop[0].wait()
                nursery.cancel_scope.cancel()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=run, name=f"voice-server-{placement}")
    thread.start()
    started.wait(180)
    try:
        if failure or not server:
            raise RuntimeError(f"the voice server did not start: {failure!r}")
        yield server[0]
    finally:
        if stop:
            trio.from_thread.run_sync(stop[0].set, trio_token=server[0].token)
        thread.join(60)
        assert not thread.is_alive(), "the voice server did not stop"
        if failure:
            raise failure[0]


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
