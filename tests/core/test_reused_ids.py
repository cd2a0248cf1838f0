"""A request id may be used again once its request completed (SGLang-Omni serves reused ids).

Each pipeline serves ``r1`` to completion, then ``r1`` again: the second one gets all its own chunks
and its own result, nothing of the first.
"""

from __future__ import annotations

import trio

import omni_trio as ot
from tests.placement import build, stage


def streaming_pipeline(placement: str) -> ot.PipelineConfig:
    # The producer's chunks (and its done signal) reach "sum" before its payload does.
    return build(
        placement,
        stage("producer", "create_producer", factory={"chunks": 4, "numel": 2}, next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", terminal=True, can_accept_stream_before_payload=True),
    )


async def test_a_completed_streams_id_streams_again(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(streaming_pipeline(placement)) as pipeline:
            first = [event async for event in pipeline.stream("r1", "go")]
            second = [event async for event in pipeline.stream("r1", "go", params={"chunks": 6})]
            third = await pipeline.submit("r1", "go", params={"chunks": 2})
            assert (await pipeline.stats()).idle
    for events, count in ((first, 4), (second, 6)):
        chunks = [event for event in events if isinstance(event, ot.StreamMessage)]
        assert [chunk.chunk_id for chunk in chunks] == list(range(count))
        assert [chunk.chunk for chunk in chunks] == [2.0 * i for i in range(count)]
        assert isinstance(events[-1], ot.CompleteMessage) and events[-1].result == {"chunks": count}
    assert third == {"chunks": 2}


async def test_a_completed_requests_id_is_computed_again(placement: str) -> None:
    config = build(
        placement,
        stage("a", "create_append", factory={"tag": "a"}, next="b"),
        stage("b", "create_append", factory={"tag": "b"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            first = await pipeline.submit("r1", "one")
            second = await pipeline.submit("r1", "two")
            events = [event async for event in pipeline.stream("r1", "three")]
            assert (await pipeline.stats()).idle
    assert first == {"trail": ["one", "a", "b"]}
    assert second == {"trail": ["two", "a", "b"]}
    assert isinstance(events[-1], ot.CompleteMessage) and events[-1].result == {"trail": ["three", "a", "b"]}
