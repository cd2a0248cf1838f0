"""An exception in user code fails that one request, names the stage, and the stage keeps serving."""

from __future__ import annotations

import pytest
import trio

import omni_trio as ot
from omni_trio.errors import QUEUE_FULL_TEXT
from tests.placement import build, stage


async def expect_failure(pipeline: ot.Pipeline, request_id: str, inputs: str) -> ot.RequestFailed:
    with pytest.raises(ot.RequestFailed) as info:
        await pipeline.submit(request_id, inputs)
    return info.value


async def test_compute_error_fails_only_that_request(placement: str) -> None:
    config = build(
        placement,
        stage("a", "create_append", factory={"tag": "a"}, next="b"),
        stage("b", "create_fail_on", factory={"word": "poison", "tag": "b"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            error = await expect_failure(pipeline, "bad", "poison")
            assert error.stage == "b"
            assert error.error == "ValueError: cannot handle 'poison'"
            assert "'b'" in str(error) and "cannot handle 'poison'" in str(error)
            assert await pipeline.submit("good", "fine") == {"trail": ["fine", "a", "b"]}
            assert (await pipeline.stats()).idle


async def test_an_error_is_a_refusal_by_what_happened_never_by_its_text(placement: str) -> None:
    """A stage's own error that reads like a full queue is a plain RequestFailed; a scheduler's
    QueueFullError is a RequestQueueFull (the ``ot.QueueFullError`` to catch) whatever its text says."""
    config = build(
        placement,
        stage("a", "create_fail_on", factory={"word": QUEUE_FULL_TEXT, "tag": "a"}, next="b"),
        stage("b", "create_refuse", terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            error = await expect_failure(pipeline, "lookalike", QUEUE_FULL_TEXT)
            assert QUEUE_FULL_TEXT in error.error
            assert type(error) is ot.RequestFailed and not isinstance(error, ot.QueueFullError)
            error = await expect_failure(pipeline, "refused", "x")
            assert isinstance(error, ot.RequestQueueFull) and isinstance(error, ot.QueueFullError)
            assert error.stage == "b" and "no room here" in error.error
            assert QUEUE_FULL_TEXT not in error.error
            assert (await pipeline.stats()).idle


def chain_with(placement: str, **hooks: object) -> ot.PipelineConfig:
    return build(
        placement,
        stage("split", "create_append", factory={"tag": "split"}, next=["upper", "count"],
              **{k: v for k, v in hooks.items() if k in ("route_fn", "project_payload")}),
        stage("upper", "create_append", factory={"tag": "upper"}, next="join"),
        stage("count", "create_append", factory={"tag": "count"}, next="join"),
        stage("join", "create_passthrough", wait_for=["upper", "count"],
              merge_fn=hooks.get("merge_fn", "tests.stages.merge_trails"),
              wait_for_fn=hooks.get("wait_for_fn"), terminal=True),
    )


@pytest.mark.parametrize(
    ("hooks", "stage_name", "message"),
    [
        ({"route_fn": "tests.stages.route_raises"}, "split", "ZeroDivisionError: route_fn exploded"),
        ({"route_fn": "tests.stages.route_outside"}, "split", "outside the allowed stages"),
        ({"route_fn": "tests.stages.route_wrong_type"}, "split", "must return a stage name or a list"),
        ({"project_payload": {"upper": "tests.stages.project_raises"}}, "split", "TypeError: projector exploded"),
        ({"merge_fn": "tests.stages.merge_raises"}, "join", "RuntimeError: merge exploded"),
        ({"wait_for_fn": "tests.stages.wait_raises"}, "join", "KeyError: 'wait_for_fn exploded'"),
    ],
    ids=["route_fn-raises", "route_fn-outside-next", "route_fn-bad-type", "projector", "merge_fn", "wait_for_fn"],
)
async def test_hook_errors_fail_only_that_request(
    placement: str, hooks: dict[str, object], stage_name: str, message: str
) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(chain_with(placement, **hooks)) as pipeline:
            for attempt in range(2):  # the stage keeps serving: the same failure, cleanly, twice
                error = await expect_failure(pipeline, f"r{attempt}", "hello world")
                assert error.stage == stage_name
                assert message in error.error
            assert (await pipeline.stats()).idle


async def test_failure_reaches_a_streaming_caller(placement: str) -> None:
    config = build(placement, stage("b", "create_fail_on", factory={"word": "poison"}, terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            with pytest.raises(ot.RequestFailed, match="cannot handle"):
                async with pipeline.stream("r0", "poison") as events:
                    async for _ in events:
                        pass
            assert (await pipeline.stats()).idle


async def test_retired_id_is_refused_by_the_stages(placement: str) -> None:
    config = build(placement, stage("b", "create_fail_on", factory={"word": "poison"}, terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            await expect_failure(pipeline, "r0", "poison")
            error = await expect_failure(pipeline, "r0", "fine")
            assert "retired after abort or failure" in error.error


async def test_warm_up_failure_fails_open_pipeline(placement: str) -> None:
    config = build(placement, stage("b", "create_warm_up_fails", terminal=True))
    with trio.fail_after(30), pytest.raises(ot.StageStartupError, match=r"'b'.*no weights here"):
        async with ot.open_pipeline(config):
            pass


async def test_factory_failure_fails_open_pipeline(placement: str) -> None:
    config = build(placement, stage("b", "create_factory_fails", terminal=True))
    with trio.fail_after(30), pytest.raises(ot.StageStartupError, match=r"'b'.*factory cannot build"):
        async with ot.open_pipeline(config):
            pass


async def test_caller_errors_leave_the_pipeline_unwrapped(placement: str) -> None:
    config = build(placement, stage("b", "create_passthrough", terminal=True))
    with trio.fail_after(30), pytest.raises(KeyError, match="mine"):
        async with ot.open_pipeline(config):
            raise KeyError("mine")
