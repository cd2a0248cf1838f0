"""One demo (omni_speech) server for a whole test module, on a trio loop in a thread.

pytest-trio gives each test its own trio.run, so a server shared by a module
runs its own loop in a thread; tests reach its pipeline through
:meth:`SpeechServer.call`, which runs a coroutine on that loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

import attrs
import pytest
import torch

import omni_trio as ot
from examples.omni_speech.pipeline import make_config
from omni_trio.serve import pcm16
from tests.serve.threaded_server import ThreadServer, server_in_thread

T = TypeVar("T")
MODEL = "omni-speech-test"
TOKENS = 6


class SpeechServer(ThreadServer):
    """The running demo server, and what ``pipeline.stream`` gives for a text."""

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
    with server_in_thread(config, SpeechServer, "speech server", start_timeout_s=120) as server:
        yield server
