"""An ``async def`` compute function that awaits asyncio runs on an asyncio loop of the scheduler thread
(the default, as in SGLang-Omni); ``run_on_trio_loop=True`` is the choice for one that awaits trio."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio

from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler, ThreadedSimpleScheduler

from .helpers import get_n, new_request, serving
from .test_async_on_loop import outputs, serve_on_loop


async def asyncio_compute(payload: StagePayload) -> dict[str, Any]:
    await asyncio.sleep(0.01)
    return {"data": payload.data, "thread": threading.get_ident(), "loop": id(asyncio.get_running_loop())}


SCHEDULERS: dict[str, Any] = {
    "simple": lambda fn: SimpleScheduler(fn),
    "simple-concurrent": lambda fn: SimpleScheduler(fn, max_concurrency=2),
    "threaded": lambda fn: ThreadedSimpleScheduler(fn, max_concurrency=2),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
async def test_an_asyncio_compute_runs_on_the_scheduler_threads_asyncio_loop(kind: str) -> None:
    # Served as a stage serves it (attached to a trio nursery): still not on the trio loop.
    scheduler = SCHEDULERS[kind](asyncio_compute)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            for data in ("a", "b"):
                scheduler.enqueue(new_request(data, data))
            outs = await trio.to_thread.run_sync(get_n, scheduler.outbox, 2)
    assert sorted((o.type, o.data["data"]) for o in outs) == [("result", "a"), ("result", "b")]
    assert all(o.data["thread"] != threading.get_ident() for o in outs)


def test_the_serial_scheduler_keeps_one_asyncio_loop_for_its_requests() -> None:
    scheduler = SimpleScheduler(asyncio_compute)
    with serving(scheduler):
        for data in ("a", "b"):
            scheduler.enqueue(new_request(data, data))
        first, second = get_n(scheduler.outbox, 2)
    assert first.data["loop"] == second.data["loop"]  # an asyncio client made in one request serves the next


async def test_run_on_trio_loop_runs_a_trio_compute_on_the_stages_loop() -> None:
    async def trio_compute(payload: StagePayload) -> dict[str, Any]:
        await trio.sleep(0.01)
        return {"data": payload.data, "thread": threading.get_ident()}

    scheduler = SimpleScheduler(trio_compute, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            scheduler.enqueue(new_request("a", "a"))
            [out] = await outputs(scheduler, 1)
    assert out.type == "result" and out.data == {"data": "a", "thread": threading.get_ident()}


def test_run_on_trio_loop_is_refused_where_it_cannot_apply() -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        return payload

    with pytest.raises(ValueError, match="needs an async def compute_fn"):
        SimpleScheduler(lambda payload: payload, run_on_trio_loop=True)
    with pytest.raises(ValueError, match="drop batch_compute_fn and inline"):
        SimpleScheduler(compute, batch_compute_fn=lambda payloads: payloads, run_on_trio_loop=True)
    with pytest.raises(ValueError, match="drop dispatch_fn"):
        ThreadedSimpleScheduler(dispatch_fn=lambda payload: None, run_on_trio_loop=True)  # type: ignore[arg-type,return-value]
