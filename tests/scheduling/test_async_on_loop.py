"""An ``async def`` compute function runs on the stage's trio loop once a stage attaches the scheduler."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from omni_trio.payload import StagePayload
from omni_trio.scheduling import OutgoingMessage, SimpleScheduler, ThreadedSimpleScheduler
from omni_trio.scheduling.on_loop import is_async_callable

from .helpers import new_request


async def outputs(scheduler: Any, count: int) -> list[OutgoingMessage]:
    """The next ``count`` messages of an outbox that only the loop fills (no thread involved)."""
    got: list[OutgoingMessage] = []
    while len(got) < count:
        await trio.testing.wait_all_tasks_blocked()
        while not scheduler.outbox.empty():
            got.append(scheduler.outbox.get_nowait())
    return got


@contextlib.asynccontextmanager
async def serve_on_loop(scheduler: Any) -> AsyncIterator[trio.Nursery]:
    """Run ``scheduler.start()`` on a thread, as the stage does, and attach it to a nursery."""
    thread = threading.Thread(target=scheduler.start, daemon=True)
    async with trio.open_nursery() as nursery:
        thread.start()
        scheduler.attach_loop(nursery)
        try:
            yield nursery
        finally:
            scheduler.stop()
            await trio.to_thread.run_sync(thread.join, 10)
            assert not thread.is_alive(), "start() did not return after stop()"


def test_what_counts_as_async() -> None:
    async def coro(payload: object) -> object:
        return payload

    class Callable_:
        async def __call__(self, payload: object) -> object:
            return payload

    import functools

    assert is_async_callable(coro) and is_async_callable(functools.partial(coro)) and is_async_callable(Callable_())
    assert not is_async_callable(lambda payload: coro(payload))  # a plain function returning a coroutine


@pytest.mark.parametrize("make", [SimpleScheduler, ThreadedSimpleScheduler])
async def test_serial_async_compute_runs_on_the_loop_in_order(make: Any) -> None:
    loop_thread = threading.get_ident()
    ran_on: set[int] = set()

    async def compute(payload: StagePayload) -> StagePayload:
        ran_on.add(threading.get_ident())
        await trio.sleep(random.random() / 100)
        payload.data = f"done:{payload.data}"
        return payload

    scheduler = make(compute, max_concurrency=1, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            for i in range(6):
                scheduler.enqueue(new_request(f"r{i}", i))
            outs = await outputs(scheduler, 6)
    assert [(o.request_id, o.type, o.data.data) for o in outs] == [(f"r{i}", "result", f"done:{i}") for i in range(6)]
    assert ran_on == {loop_thread}
    assert scheduler.busy.seconds > 0


@pytest.mark.parametrize("make", [SimpleScheduler, ThreadedSimpleScheduler])
async def test_async_errors_become_error_messages_and_serving_goes_on(make: Any) -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        await trio.lowlevel.checkpoint()
        if payload.data == "bad":
            raise KeyError("bad")
        return payload

    scheduler = make(compute, max_concurrency=1, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            scheduler.enqueue(new_request("bad", "bad"))
            scheduler.enqueue(new_request("ok", "ok"))
            bad, ok = await outputs(scheduler, 2)
    assert (bad.request_id, bad.type) == ("bad", "error") and isinstance(bad.data, KeyError)
    assert (ok.request_id, ok.type) == ("ok", "result")


@pytest.mark.parametrize("make", [SimpleScheduler, ThreadedSimpleScheduler])
async def test_abort_cancels_a_running_async_compute_and_skips_a_queued_one(make: Any) -> None:
    cancelled: list[str] = []
    aborted: list[str] = []
    started: list[str] = []

    async def compute(payload: StagePayload) -> StagePayload:
        started.append(payload.request_id)
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(payload.request_id)
            raise
        raise AssertionError("unreachable")

    scheduler = make(compute, max_concurrency=1, abort_callback=aborted.append, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            scheduler.enqueue(new_request("running"))
            scheduler.enqueue(new_request("queued"))
            await trio.testing.wait_all_tasks_blocked()
            assert started == ["running"]
            scheduler.abort("queued")
            scheduler.abort("running")
            await trio.testing.wait_all_tasks_blocked()
            assert cancelled == ["running"] and started == ["running"]
            assert scheduler.outbox.empty()
            assert scheduler.running_computes() == {}
    assert set(aborted) == {"running", "queued"}


async def test_concurrent_async_computes_overlap() -> None:
    inside = 0
    most = 0

    async def compute(payload: StagePayload) -> StagePayload:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await trio.sleep(0.01)
        inside -= 1
        return payload

    scheduler = SimpleScheduler(compute, max_concurrency=3, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            for i in range(6):
                scheduler.enqueue(new_request(f"r{i}"))
            outs = await outputs(scheduler, 6)
    assert sorted(o.request_id for o in outs) == [f"r{i}" for i in range(6)] and most == 3


async def test_max_pending_counts_the_requests_waiting_on_the_loop() -> None:
    from omni_trio.scheduling import QueueFullError

    async def compute(payload: StagePayload) -> StagePayload:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    scheduler = SimpleScheduler(compute, max_pending=1, run_on_trio_loop=True)
    with trio.fail_after(10):
        async with serve_on_loop(scheduler):
            scheduler.enqueue(new_request("running"))
            await trio.testing.wait_all_tasks_blocked()
            scheduler.enqueue(new_request("waiting"))
            with pytest.raises(QueueFullError):
                scheduler.enqueue(new_request("refused"))
            scheduler.abort("running")


async def test_stop_lets_the_running_compute_finish_first() -> None:
    release = trio.Event()

    async def compute(payload: StagePayload) -> StagePayload:
        await release.wait()
        return payload

    scheduler = SimpleScheduler(compute, run_on_trio_loop=True)
    thread = threading.Thread(target=scheduler.start, daemon=True)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            thread.start()
            scheduler.attach_loop(nursery)
            scheduler.enqueue(new_request("r1"))
            scheduler.enqueue(new_request("r2"))
            await trio.testing.wait_all_tasks_blocked()
            scheduler.stop()
            await trio.testing.wait_all_tasks_blocked()
            assert thread.is_alive(), "the scheduler counts as stopped while a compute still runs"
            release.set()
            await trio.to_thread.run_sync(thread.join, 10)
            assert not thread.is_alive()
    outs = await outputs(scheduler, 1)
    assert [o.request_id for o in outs] == ["r1"] and scheduler.outbox.empty()
