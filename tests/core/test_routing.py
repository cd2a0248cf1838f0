"""Routing: dynamic fan-in with route_fn, multi-terminal merge, streaming to the caller."""

from __future__ import annotations

import torch
import trio

import omni_trio as ot
from tests.placement import build, stage


def dynamic_fan_in(placement: str) -> ot.PipelineConfig:
    return build(
        placement,
        stage("split", "create_append", factory={"tag": "split"}, next=["upper", "count"],
              route_fn="tests.stages.route_by_words"),
        stage("upper", "create_append", factory={"tag": "upper"}, next="join"),
        stage("count", "create_append", factory={"tag": "count"}, next="join"),
        stage("join", "create_passthrough", wait_for=["upper", "count"],
              merge_fn="tests.stages.merge_trails", wait_for_fn="tests.stages.wait_by_words", terminal=True),
    )


async def test_wait_for_fn_follows_route_fn(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(dynamic_fan_in(placement)) as pipeline:
            one = await pipeline.submit("one", "hello")
            two = await pipeline.submit("two", "hello world")
            assert (await pipeline.stats()).idle
    assert one == {"upper": ["hello", "split", "upper"]}
    assert two == {"count": ["hello world", "split", "count"], "upper": ["hello world", "split", "upper"]}


async def test_multi_terminal_results_are_keyed_by_stage(placement: str) -> None:
    config = build(
        placement,
        stage("src", "create_append", factory={"tag": "src"}, next=["near", "far"]),
        stage("near", "create_append", factory={"tag": "near"}, terminal=True),
        stage("far", "create_append", factory={"tag": "far"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            result = await pipeline.submit("r0", "x")
            events = [event async for event in pipeline.stream("r1", "y")]
    assert result == {"near": {"trail": ["x", "src", "near"]}, "far": {"trail": ["x", "src", "far"]}}
    completes = sorted((e.from_stage, e.result["trail"][-1]) for e in events)
    assert completes == [("far", "far"), ("near", "near")]
    assert all(isinstance(e, ot.CompleteMessage) for e in events)


async def test_fan_out_without_isolation_gives_each_target_its_own_copy(placement: str) -> None:
    # project_same returns the payload itself: the two targets must not share it.
    config = build(
        placement,
        stage("src", "create_append", factory={"tag": "src"}, next=["a", "b"],
              project_payload={"a": "tests.stages.project_same", "b": "tests.stages.project_same"}),
        stage("a", "create_append", factory={"tag": "a"}, terminal=True),
        stage("b", "create_append", factory={"tag": "b"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            result = await pipeline.submit("r0", "x")
    assert result == {"a": {"trail": ["x", "src", "a"]}, "b": {"trail": ["x", "src", "b"]}}


async def test_stream_chunks_reach_the_caller_in_order(placement: str) -> None:
    config = build(
        placement,
        stage("producer", "create_producer", factory={"chunks": 5, "numel": 4}, next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", terminal=True, can_accept_stream_before_payload=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            events = [event async for event in pipeline.stream("r0", "go")]
            assert (await pipeline.stats()).idle
    chunks = [e for e in events if isinstance(e, ot.StreamMessage)]
    assert [c.chunk_id for c in chunks] == [0, 1, 2, 3, 4]
    assert [c.chunk for c in chunks] == [0.0, 4.0, 8.0, 12.0, 16.0]
    assert {c.modality for c in chunks} == {"sum"}
    assert isinstance(events[-1], ot.CompleteMessage) and events[-1].result == {"chunks": 5}


async def test_tensor_results_reach_the_caller_as_tensors(placement: str) -> None:
    config = build(placement, stage("src", "create_tensor_source", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            result = await pipeline.submit("r0", "x", params={"numel": 300_000})
    assert isinstance(result["pcm"], torch.Tensor)
    assert torch.equal(result["pcm"], torch.arange(300_000, dtype=torch.float32))
    assert torch.equal(result["meta"]["ids"], torch.tensor([1, 2, 3]))


async def test_chunks_before_payload_need_opt_in(placement: str) -> None:
    config = build(
        placement,
        stage("producer", "create_producer", next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            try:
                await pipeline.submit("r0", "go")
            except ot.RequestFailed as exc:
                assert exc.stage == "sum"
                assert "before the request payload" in exc.error
            else:
                raise AssertionError("expected RequestFailed")
            assert (await pipeline.stats()).idle
