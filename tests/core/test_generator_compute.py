"""A generator compute function, end to end: its yields reach the caller as stream chunks, in order,
before its return value arrives as the result; an error inside fails the request with the stage's name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.payload import StagePayload
from tests.placement import build


def spell(payload: StagePayload) -> Iterator[Any]:
    word = str(payload.request.inputs)
    if word == "boom":
        raise ValueError("cannot spell boom")
    for letter in word:
        yield {"modality": "text", "letter": letter}
    payload.data = {"letters": len(word)}
    return payload


def create_speller(threaded: bool = False) -> Any:
    return ot.ThreadedSimpleScheduler(spell, max_concurrency=2) if threaded else ot.SimpleScheduler(spell)


def speller(placement: str, threaded: bool) -> ot.PipelineConfig:
    return build(
        placement,
        ot.StageConfig(
            name="spell",
            factory_path="tests.core.test_generator_compute.create_speller",
            factory={"threaded": threaded},
            terminal=True,
        ),
    )


@pytest.mark.parametrize("threaded", [False, True])
async def test_yields_stream_to_the_caller_before_the_result(placement: str, threaded: bool) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(speller(placement, threaded)) as pipeline:
            events = [event async for event in pipeline.stream("r1", "abc")]
            result = await pipeline.submit("r2", "hello")
            with pytest.raises(ot.RequestFailed) as failed:
                await pipeline.submit("r3", "boom")
            assert (await pipeline.stats()).idle
    chunks = [event for event in events if isinstance(event, ot.StreamMessage)]
    assert [chunk.chunk["letter"] for chunk in chunks] == ["a", "b", "c"]
    assert [chunk.chunk_id for chunk in chunks] == [0, 1, 2]
    assert isinstance(events[-1], ot.CompleteMessage) and events[-1].result == {"letters": 3}
    assert result == {"letters": 5}
    assert failed.value.stage == "spell" and "cannot spell boom" in failed.value.error
