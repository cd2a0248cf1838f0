"""The speech pipeline, run once per placement for the whole session.

A ``processes`` pipeline takes seconds to start (a worker per model, each
importing torch), so every scenario the tests check runs in one pipeline per
placement, under ``trio.fail_after``, and the tests assert on the recording.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import omni_trio as ot
from examples.omni_speech.pipeline import PLACEMENTS, Speech, make_config, speak

TEXT = "What do you hear?"
AUDIO = {"seconds": 0.5, "freq_hz": 330.0}
TOKENS = 8


@attrs.define
class Aborted:
    """What the caller saw when it left the stream after the first audio chunk."""

    chunks: int
    idle_after: bool
    stats_after: ot.PipelineStats
    abort_again: bool


@attrs.define
class Recording:
    """Everything one placement's pipeline did for the tests."""

    placement: str
    with_audio: Speech
    text_only: Speech
    aborted: Aborted
    after_abort: Speech
    concurrent: list[Speech]
    events: list[dict[str, Any]]


async def record(placement: str, trace: Path) -> Recording:
    """Run every scenario through one pipeline with tracing on."""
    with trio.fail_after(60):
        async with ot.open_pipeline(make_config(placement), trace=trace) as pipeline:
            with_audio = await speak(pipeline, "with-audio", TEXT, audio=AUDIO, max_new_tokens=TOKENS)
            text_only = await speak(pipeline, "text-only", TEXT, max_new_tokens=TOKENS)

            chunks = 0
            async with pipeline.stream("abort-me", TEXT, params={"audio": AUDIO, "max_new_tokens": 200}) as events:
                async for event in events:
                    if isinstance(event, ot.StreamMessage):
                        chunks += 1
                        break  # leaving the block aborts the request
            stats = await pipeline.stats()
            aborted = Aborted(chunks, stats.idle, stats, await pipeline.abort("abort-me"))
            after_abort = await speak(pipeline, "after-abort", TEXT, max_new_tokens=TOKENS)

            concurrent: dict[int, Speech] = {}

            async def one(index: int) -> None:
                concurrent[index] = await speak(pipeline, f"concurrent-{index}", TEXT, audio=AUDIO,
                                                max_new_tokens=TOKENS)

            async with trio.open_nursery() as nursery:
                for index in range(3):
                    nursery.start_soon(one, index)
    return Recording(placement, with_audio, text_only, aborted, after_abort,
                     [concurrent[i] for i in range(3)], ot.read_trace(trace))


def _recording(placement: str, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return trio.run(record, placement, tmp_path_factory.mktemp(placement) / "trace.jsonl")


@pytest.fixture(scope="session")
def embedded_run(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return _recording("embedded", tmp_path_factory)


@pytest.fixture(scope="session")
def processes_run(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    return _recording("processes", tmp_path_factory)


@pytest.fixture(params=PLACEMENTS)
def speech_run(request: pytest.FixtureRequest) -> Recording:
    """The recording of the pipeline in each placement (embedded, processes)."""
    recording: Recording = request.getfixturevalue(f"{request.param}_run")
    return recording
