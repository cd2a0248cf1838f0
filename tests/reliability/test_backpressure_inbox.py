"""A bounded scheduler inbox: beyond ``max_pending`` waiting requests, a new request fails at once
with a RequestQueueFull (a RequestFailed) that names the limit; the others are served once the stage gets going."""

from __future__ import annotations

import queue
import uuid

import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.scheduling import QueueFullError
from tests import stages
from tests.placement import stage


async def test_request_beyond_max_pending_fails_clearly_and_the_others_complete() -> None:
    name = f"gated-{uuid.uuid4().hex[:8]}"
    started, release = stages.gate(name)
    config = ot.PipelineConfig(
        stages=[stage("gated", "create_gated", factory={"name": name, "max_pending": 2}, terminal=True)]
    )
    results: dict[str, object] = {}
    refused: list[ot.RequestFailed] = []

    async def submit(pipeline: ot.Pipeline, request_id: str) -> None:
        try:
            results[request_id] = await pipeline.submit(request_id, request_id)
        except ot.RequestFailed as exc:
            refused.append(exc)
            # Refused at once, while every other request still waits: nothing else finished yet.
            assert not results

    try:
        with trio.fail_after(20):
            async with ot.open_pipeline(config) as pipeline:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit, pipeline, "r0")
                    # r0 is computing (blocked): r1..r3 find one running request and queue behind it.
                    await trio.to_thread.run_sync(started.wait)
                    for request_id in ("r1", "r2", "r3"):
                        nursery.start_soon(submit, pipeline, request_id)
                    # Two fit in the inbox; the third is refused before anything is released.
                    await trio.testing.wait_all_tasks_blocked()
                    assert len(refused) == 1
                    release.set()
                stats = await pipeline.stats()
    finally:
        release.set()  # a failing test must not leave the scheduler thread blocked
        stages.GATES.pop(name, None)

    (error,) = refused
    assert error.stage == "gated" and isinstance(error, ot.RequestQueueFull)
    assert "max_pending=2" in error.error and "stage inbox is full" in error.error
    assert len(results) == 3 and "r0" in results
    assert error.request_id not in results
    for request_id, result in results.items():
        assert result == {"trail": [request_id, name]}
    assert stats.idle, stats


def test_simple_scheduler_refuses_only_new_requests_beyond_the_limit() -> None:
    scheduler = ot.SimpleScheduler(lambda payload: payload, max_pending=1)
    scheduler.enqueue(ot.IncomingMessage("a", "new_request", None))
    with pytest.raises(QueueFullError, match=r"stage inbox is full \(max_pending=1\)"):
        scheduler.enqueue(ot.IncomingMessage("b", "new_request", None))
    scheduler.enqueue(ot.IncomingMessage("a", "stream_chunk", None))  # belongs to an admitted request
    scheduler.inbox.get()  # the scheduler takes "a": room for one more
    scheduler.enqueue(ot.IncomingMessage("b", "new_request", None))


@pytest.mark.parametrize(
    "make",
    [
        lambda: ot.StreamingSimpleScheduler(lambda payload: payload, max_pending=1),
        lambda: ot.ThreadedSimpleScheduler(lambda payload: payload, max_pending=1),
    ],
    ids=["streaming", "threaded"],
)
def test_other_schedulers_take_max_pending(make: object) -> None:
    scheduler = make()  # type: ignore[operator]
    scheduler.enqueue(ot.IncomingMessage("a", "new_request", None))
    with pytest.raises(QueueFullError, match="max_pending=1"):
        scheduler.enqueue(ot.IncomingMessage("b", "new_request", None))
    assert isinstance(scheduler.inbox, queue.Queue)


def test_max_pending_must_be_a_whole_number() -> None:
    with pytest.raises(ValueError, match="max_pending"):
        ot.SimpleScheduler(lambda payload: payload, max_pending=-1)
