"""A realtime client that leaves mid-answer, with the stages in worker processes.

Nothing waits by polling: stopping the server (its ``shutdown`` event) lets
every connection's task finish, and ``serve_http`` returns only after they
did, well inside the grace period, so the connection's own cleanup (closing
its transcription session, aborting its answer) has run by then.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import trio

import omni_trio as ot
from examples.omni_speech.serve_voice import make_serve_voice_config
from tests.process.helpers import nothing_left_behind
from tests.serve.voice_server import MODEL, realtime_client, send_audio, silence, speech_pcm16, until

GRACE_S = 60.0


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="otd-"))  # short: Unix socket paths are at most ~100 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _leave_mid_answer(ws_url: str) -> None:
    async with realtime_client(ws_url).realtime.connect(model=MODEL) as connection:
        await until(connection, "session.created", [])
        await send_audio(connection, speech_pcm16("one two three four five") + silence(1.0))
        await until(connection, "response.output_audio.delta", [])


def test_disconnect_closes_the_session_and_aborts_the_answer(base: Path) -> None:
    config = make_serve_voice_config("processes", model=MODEL)
    assert config.serve is not None
    config = attrs.evolve(config, endpoints=ot.EndpointsConfig(base_path=str(base)),
                          serve=attrs.evolve(config.serve, grace_period_s=GRACE_S))

    async def main() -> None:
        with trio.fail_after(180):
            async with ot.open_pipeline(config) as pipeline:
                shutdown = trio.Event()
                async with trio.open_nursery() as nursery:
                    address = await nursery.start(
                        functools.partial(ot.serve_http, pipeline, config, "127.0.0.1", 0, shutdown=shutdown))
                    ws_url = address.url.replace("http://", "ws://") + "/v1"
                    await trio.to_thread.run_sync(lambda: asyncio.run(_leave_mid_answer(ws_url)))
                    shutdown.set()
                    stopping = trio.current_time()
                # Returned well before the grace period would have cut the connection's task short.
                assert trio.current_time() - stopping < GRACE_S / 2
                assert (await pipeline.stats()).live_requests == 0

    with nothing_left_behind(base):
        trio.run(main)
