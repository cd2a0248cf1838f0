"""One demo (omni_speech) server for a whole test module, on a trio loop in a thread.

pytest-trio gives each test its own trio.run, so a server shared by a module
runs its own loop in a thread; tests reach its pipeline through
:meth:`SpeechServer.call`, which runs a coroutine on that loop.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import pytest
import torch
import trio

import omni_trio as ot
from examples.omni_speech.pipeline import make_config
from omni_trio.serve import pcm16

T = TypeVar("T")
MODEL = "omni-speech-test"
TOKENS = 6


@attrs.define
class SpeechServer:
    """The running server: its URL, and a way into its loop."""

    url: str
    pipeline: ot.Pipeline
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``await fn(*args)`` on the server's loop, from a test's thread."""
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def expected_pcm(self, text: str, **params: Any) -> bytes:
        """The PCM16 bytes ``pipeline.stream`` gives for ``text`` (the adapter's own params)."""

        async def collect() -> bytes:
            chunks = []
            async with self.pipeline.stream(f"direct-{text}-{len(params)}", text,
                                            params={"max_new_tokens": TOKENS, **params}) as events:
                async for event in events:
                    if isinstance(event, ot.StreamMessage):
                        chunks.append(event.chunk)
            return pcm16(torch.cat(chunks))

        return self.call(collect)


@pytest.fixture(scope="module")
def speech_server() -> Iterator[SpeechServer]:
    """The embedded demo pipeline behind ``ot.serve_http`` on a free port."""
    config = attrs.evolve(
        make_config("embedded"),
        max_in_flight=16,
        serve=ot.ServeConfig(model=MODEL, adapter="examples.omni_speech.serve.SpeechAdapter",
                             adapter_options={"max_new_tokens": TOKENS, "max_tokens_limit": 1000}),
    )
    started = threading.Event()
    stop: list[trio.Event] = []
    server: list[SpeechServer] = []
    failure: list[BaseException] = []

    async def main() -> None:
        with trio.fail_after(600):  # the whole module's tests
            async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
                server.append(SpeechServer(address.url, pipeline, trio.lowlevel.current_trio_token()))
                stop.append(trio.Event())
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

    thread = threading.Thread(target=run, name="speech-server")
    thread.start()
    started.wait(120)
    try:
        if failure or not server:
            raise RuntimeError(f"the speech server did not start: {failure!r}")
        yield server[0]
    finally:
        if stop:
            trio.from_thread.run_sync(stop[0].set, trio_token=server[0].token)
        thread.join(60)
        assert not thread.is_alive(), "the speech server did not stop"
        if failure:
            raise failure[0]
