"""Generator compute functions: each yield is a stream chunk, the return value the result."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from omni_trio.payload import StagePayload
from omni_trio.scheduling import OutgoingMessage, SimpleScheduler, ThreadedSimpleScheduler

from .helpers import TIMEOUT, assert_quiet, get, get_n, new_request, serving


def count_up(payload: StagePayload) -> Iterator[Any]:
    yield from range(int(payload.data))
    yield OutgoingMessage("ignored", "stream", data="last", metadata={"modality": "text"})
    return {"counted": int(payload.data)}


SCHEDULERS: dict[str, Any] = {
    "simple": lambda fn: SimpleScheduler(fn),
    "simple-concurrent": lambda fn: SimpleScheduler(fn, max_concurrency=2),
    "threaded": lambda fn: ThreadedSimpleScheduler(fn, max_concurrency=2),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_yields_are_chunks_in_order_before_the_result(kind: str) -> None:
    scheduler = SCHEDULERS[kind](count_up)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", 3))
        outs = get_n(scheduler.outbox, 5)
    assert [(o.request_id, o.type, o.data) for o in outs] == [
        ("r1", "stream", 0),
        ("r1", "stream", 1),
        ("r1", "stream", 2),
        ("r1", "stream", "last"),
        ("r1", "result", {"counted": 3}),
    ]
    assert outs[3].metadata == {"modality": "text"}


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_an_async_generator_streams_on_the_scheduler_threads_loop(kind: str) -> None:
    async def ticks(payload: StagePayload) -> AsyncIterator[str]:
        for i in range(2):
            await asyncio.sleep(0.001)
            yield f"tick{i}"
        payload.data = "ticked"

    scheduler = SCHEDULERS[kind](ticks)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "go"))
        outs = get_n(scheduler.outbox, 3)
    assert [o.data for o in outs[:2]] == ["tick0", "tick1"]
    assert outs[2].type == "result" and outs[2].data.data == "ticked"  # the payload it was given


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_an_error_inside_fails_the_request_with_its_message(kind: str) -> None:
    def broken(payload: StagePayload) -> Iterator[int]:
        yield 1
        raise ValueError("no more tokens")

    scheduler = SCHEDULERS[kind](broken)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "go"))
        first, error = get_n(scheduler.outbox, 2)
    assert (first.type, first.data) == ("stream", 1)
    assert error.type == "error" and isinstance(error.data, ValueError) and str(error.data) == "no more tokens"


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_abort_mid_generation_closes_the_generator(kind: str) -> None:
    resume = threading.Event()
    closed = threading.Event()

    def endless(payload: StagePayload) -> Iterator[int]:
        if payload.data == "quick":
            return "quick"
        try:
            i = 0
            while True:
                yield i
                resume.wait(TIMEOUT)
                i += 1
        finally:
            closed.set()

    scheduler = SCHEDULERS[kind](endless)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "go"))
        assert get(scheduler.outbox).data == 0
        scheduler.abort("r1")
        resume.set()
        assert closed.wait(TIMEOUT)
        assert_quiet(scheduler.outbox, 0.1)
        scheduler.enqueue(new_request("r2", "quick"))  # the scheduler goes on serving
        out = get(scheduler.outbox)
        assert (out.request_id, out.type, out.data) == ("r2", "result", "quick")


def test_a_batch_generator_yields_index_and_chunk_pairs() -> None:
    def batch(payloads: list[StagePayload]) -> Iterator[tuple[int, str]]:
        for index, payload in enumerate(payloads):
            yield index, f"part of {payload.data}"
        return [payload.data.upper() for payload in payloads]

    gate = threading.Event()

    def hold(payload: StagePayload) -> str:
        gate.wait(TIMEOUT)
        return "held"

    scheduler = SimpleScheduler(hold, batch_compute_fn=batch, max_batch_size=2, max_batch_wait_ms=5_000)
    scheduler.inbox.put(new_request("a", "x"))
    scheduler.inbox.put(new_request("b", "y"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 4)
    assert [(o.request_id, o.type, o.data) for o in outs] == [
        ("a", "stream", "part of x"),
        ("b", "stream", "part of y"),
        ("a", "result", "X"),
        ("b", "result", "Y"),
    ]


def test_a_batch_generator_with_a_bad_yield_fails_the_batch() -> None:
    def batch(payloads: list[StagePayload]) -> Iterator[str]:
        yield "not a pair"
        return [p.data for p in payloads]

    scheduler = SimpleScheduler(lambda p: p, batch_compute_fn=batch, max_batch_size=2)
    scheduler.inbox.put(new_request("a", "x"))
    scheduler.inbox.put(new_request("b", "y"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 2)
    assert {o.type for o in outs} == {"error"} and "(index, chunk) pairs" in str(outs[0].data)


def test_inline_compute_streams_a_sync_generator() -> None:
    scheduler = SimpleScheduler(count_up, inline=True)
    scheduler.enqueue(new_request("r1", 1))
    assert [o.data for o in get_n(scheduler.outbox, 3)] == [0, "last", {"counted": 1}]
