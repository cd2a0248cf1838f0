"""examples/realtime_asr.py: audio chunks in through a session, partial transcripts out, in every placement."""

from __future__ import annotations

import trio

import omni_trio as ot
from examples import realtime_asr


async def test_the_realtime_asr_example_streams_partial_transcripts(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(realtime_asr.make_config(placement)) as pipeline:
            async with trio.open_nursery() as nursery:
                results: dict[str, list[str]] = {}

                async def speaker(name: str, text: str) -> None:
                    results[name] = await realtime_asr.transcribe(pipeline, name, text)

                nursery.start_soon(speaker, "a", "hello omni")
                nursery.start_soon(speaker, "b", "trio sessions")
            assert (await pipeline.stats()).idle
    assert results["a"] == ["he", "hello", "hello o", "hello omni"]
    assert results["b"][-1] == "trio sessions"
    assert all(later.startswith(earlier) for earlier, later in zip(results["b"], results["b"][1:], strict=False))
