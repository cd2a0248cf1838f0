"""Abort, deadlines and request ids: a finished request leaves nothing behind."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import trio
import trio.testing

import omni_trio as ot
from tests.placement import build, stage


def fan_in_with_slow_branch(placement: str) -> ot.PipelineConfig:
    return build(
        placement,
        stage("split", "create_append", factory={"tag": "split"}, next=["fast", "slow"]),
        stage("fast", "create_append", factory={"tag": "fast"}, next="join"),
        stage("slow", "create_block_until_aborted", next="join"),
        stage("join", "create_passthrough", wait_for=["fast", "slow"], merge_fn="tests.stages.merge_trails",
              terminal=True),
    )


async def wait_until(predicate: object) -> None:
    # Event-driven: re-check only when every task is blocked (no sleeping loop).
    while not await predicate():  # type: ignore[operator]
        await trio.testing.wait_all_tasks_blocked()


async def submit_until_aborted(pipeline: ot.Pipeline, request_id: str, aborts: list[ot.RequestAborted]) -> None:
    """Submit ``request_id``; its ``RequestAborted`` goes into ``aborts``."""
    try:
        await pipeline.submit(request_id, "go")
    except ot.RequestAborted as exc:
        aborts.append(exc)


async def test_abort_during_fan_in_wait_and_compute(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(fan_in_with_slow_branch(placement)) as pipeline:
            outcome: list[ot.RequestAborted] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(submit_until_aborted, pipeline, "r0", outcome)

                async def fan_in_pending() -> bool:
                    return (await pipeline.stats()).stages["join"].pending_fan_in == 1

                await wait_until(fan_in_pending)  # 'fast' arrived, 'slow' is computing
                assert await pipeline.abort("r0") is True
            assert len(outcome) == 1 and outcome[0].request_id == "r0"
            stats = await pipeline.stats()
            assert stats.idle, stats
            assert await pipeline.abort("r0") is False
            # The pipeline still serves.
            result = await pipeline.submit("r1", "go", params={"block": False})
            assert result == {"fast": ["go", "split", "fast"], "slow": ["slow"]}


async def test_an_abort_called_from_a_cancelled_scope_still_completes(placement: str) -> None:
    # abort() is shielded: its caller's cancellation neither interrupts it nor leaves the request
    # half-aborted (the request's stage still holds it otherwise).
    config = build(placement, stage("slow", "create_block_until_aborted", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            outcome: list[ot.RequestAborted] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(submit_until_aborted, pipeline, "r0", outcome)

                async def computing() -> bool:
                    return (await pipeline.stats()).stages["slow"].active_requests == 1

                await wait_until(computing)
                with trio.CancelScope() as scope:
                    scope.cancel()
                    accepted = await pipeline.abort("r0")
                assert accepted is True and not scope.cancelled_caught
            assert [exc.request_id for exc in outcome] == ["r0"]
            assert (await pipeline.stats()).idle


async def test_abort_unknown_or_finished_request_returns_false(placement: str) -> None:
    config = build(placement, stage("a", "create_append", factory={"tag": "a"}, terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            assert await pipeline.abort("nobody") is False
            await pipeline.submit("r0", "x")
            assert await pipeline.abort("r0") is False
            assert await pipeline.submit("r0", "again") == {"trail": ["again", "a"]}  # success frees the id


@contextlib.contextmanager
def autojump(clock: trio.testing.MockClock) -> Iterator[None]:
    """Virtual time only while the pipeline runs: start-up and shutdown wait on real
    threads and processes, which an autojumping clock would mistake for idleness.
    The threshold lets real replies from worker processes (milliseconds, more on
    a loaded machine) arrive before the clock jumps to the next deadline."""
    clock.autojump_threshold = 1.0
    try:
        yield
    finally:
        clock.autojump_threshold = math.inf


async def test_deadline_aborts_everywhere(placement: str, mock_clock: trio.testing.MockClock) -> None:
    config = build(placement, stage("slow", "create_block_until_aborted", terminal=True))
    async with ot.open_pipeline(config) as pipeline:
        with autojump(mock_clock), trio.fail_after(300):
            with pytest.raises(ot.RequestTimeout) as info:
                await pipeline.submit("r0", "go", deadline=120)
            assert info.value.deadline == 120 and "120" in str(info.value)
            assert trio.current_time() >= 120
            assert (await pipeline.stats()).idle


async def test_deadline_applies_to_streams(placement: str, mock_clock: trio.testing.MockClock) -> None:
    config = build(placement, stage("slow", "create_block_until_aborted", terminal=True))
    async with ot.open_pipeline(config) as pipeline:
        with autojump(mock_clock), trio.fail_after(300):
            with pytest.raises(ot.RequestTimeout):
                async for _ in pipeline.stream("r0", "go", deadline=5):
                    pass
            assert (await pipeline.stats()).idle


async def test_caller_cancellation_aborts_the_request(placement: str) -> None:
    config = build(placement, stage("slow", "create_block_until_aborted", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            with trio.move_on_after(0.2):
                await pipeline.submit("r0", "go")
            assert (await pipeline.stats()).idle


async def test_leaving_a_stream_early_aborts_the_request(placement: str) -> None:
    config = build(
        placement,
        stage("producer", "create_producer", factory={"chunks": 1000, "numel": 4}, next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", terminal=True, can_accept_stream_before_payload=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            async with pipeline.stream("r0", "go") as events:
                async for event in events:
                    assert isinstance(event, ot.StreamMessage)
                    break
            assert await pipeline.abort("r0") is False
            stats = await pipeline.stats()
            assert stats.live_requests == 0
            assert stats.stages["sum"].active_requests == 0


async def test_duplicate_live_id_is_refused_and_nothing_is_sent(placement: str) -> None:
    config = build(placement, stage("slow", "create_block_until_aborted", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pipeline.submit, "r0", "go")
                await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(ot.DuplicateRequestId, match="'r0' already exists"):
                    await pipeline.submit("r0", "again")
                with pytest.raises(ot.DuplicateRequestId):
                    async for _ in pipeline.stream("r0", "again"):
                        pass
                stats = await pipeline.stats()
                assert stats.live_requests == 1
                assert stats.stages["slow"].active_requests == 1
                nursery.cancel_scope.cancel()
            assert (await pipeline.stats()).idle


async def test_bad_request_arguments_are_refused(placement: str) -> None:
    config = build(placement, stage("a", "create_passthrough", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            with pytest.raises(ValueError, match="non-empty strings"):
                await pipeline.submit("", "x")
            with pytest.raises(ValueError, match="unknown session operation"):
                await pipeline.submit("r0", "x", metadata={"omni_session": {}})
            with pytest.raises(ValueError, match="needs 'stages'"):
                await pipeline.submit("r0", "x", metadata={"omni_session": {"op": "open", "session_id": "s"}})
            with pytest.raises(ValueError, match="deadline"):
                await pipeline.submit("r0", "x", deadline=0)
        with pytest.raises(ot.PipelineClosed):
            await pipeline.submit("r1", "x")
