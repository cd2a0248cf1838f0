"""SimpleScheduler (SPEC §5.1)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from omni_trio.payload import StagePayload
from omni_trio.scheduling import Inbox, IncomingMessage, SimpleScheduler, StageScheduler

from .helpers import TIMEOUT, assert_quiet, get, get_n, new_request, served_one, serving


def tag(payload: StagePayload, value: Any) -> StagePayload:
    payload.data = value
    return payload


def batch_size_scheduler(**options: Any) -> SimpleScheduler:
    """The seed's toy encoder: every result says how big its batch was."""

    def one(payload: StagePayload) -> StagePayload:
        return tag(payload, {"batch_size": 1})

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        return [tag(p, {"batch_size": len(payloads)}) for p in payloads]

    return SimpleScheduler(one, batch_compute_fn=batch, **options)


def test_satisfies_the_stage_contract() -> None:
    assert isinstance(SimpleScheduler(lambda payload: payload), StageScheduler)


def test_single_compute_returns_result() -> None:
    scheduler = SimpleScheduler(lambda payload: payload)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "hello"))
        out = get(scheduler.outbox)
    assert (out.request_id, out.type) == ("r1", "result")
    assert isinstance(out.data, StagePayload) and out.data.data == "hello"


def test_async_compute_fn_runs_on_private_loop() -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        await asyncio.sleep(0.01)
        return tag(payload, f"async:{payload.data}")

    scheduler = SimpleScheduler(compute)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "x"))
        scheduler.enqueue(new_request("r2", "y"))
        outs = get_n(scheduler.outbox, 2)
    assert [o.data.data for o in outs] == ["async:x", "async:y"]


def test_error_becomes_error_message_and_scheduler_keeps_serving() -> None:
    boom = RuntimeError("boom")

    def compute(payload: StagePayload) -> StagePayload:
        if payload.data == "bad":
            raise boom
        return payload

    scheduler = SimpleScheduler(compute)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1", "bad"))
        scheduler.enqueue(new_request("r2", "good"))
        first, second = get_n(scheduler.outbox, 2)
    assert (first.request_id, first.type, first.data) == ("r1", "error", boom)
    assert (second.request_id, second.type) == ("r2", "result")


def test_enqueue_runs_arrival_hook_then_queues() -> None:
    seen: list[str] = []
    scheduler = SimpleScheduler(lambda payload: payload, request_arrival_hook=lambda p: seen.append(p.request_id))
    scheduler.enqueue(new_request("r1"))
    scheduler.enqueue(IncomingMessage("r1", "stream_done"))
    assert seen == ["r1"]
    assert scheduler.inbox.qsize() == 2


def test_lone_request_runs_at_once_when_not_waiting_when_idle() -> None:
    # A 60 s window would blow the 10 s bound if a lone request waited for it.
    scheduler = batch_size_scheduler(max_batch_size=8, max_batch_wait_ms=60_000)
    assert scheduler.batch_wait_when_idle is False
    with serving(scheduler):
        started = time.monotonic()
        scheduler.enqueue(new_request("lone"))
        out = get(scheduler.outbox)
    assert out.data.data == {"batch_size": 1}
    assert time.monotonic() - started < TIMEOUT / 2


def test_waiting_when_idle_holds_first_request_until_second_joins() -> None:
    scheduler = batch_size_scheduler(max_batch_size=2, max_batch_wait_ms=60_000, batch_wait_when_idle=True)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1"))
        assert_quiet(scheduler.outbox, 0.3)
        scheduler.enqueue(new_request("r2"))
        outs = get_n(scheduler.outbox, 2)
    assert sorted(o.request_id for o in outs) == ["r1", "r2"]
    assert all(o.data.data == {"batch_size": 2} for o in outs)


def test_seed_encoder_batches_burst_and_waits_window_when_idle() -> None:
    scheduler = batch_size_scheduler(max_batch_size=8, max_batch_wait_ms=200, batch_wait_when_idle=True)
    for i in range(4):
        scheduler.inbox.put(new_request(f"burst-{i}"))
    with serving(scheduler):
        burst = get_n(scheduler.outbox, 4)
        started = time.monotonic()
        scheduler.enqueue(new_request("lone"))
        lone = get(scheduler.outbox)
        waited = time.monotonic() - started
    assert [o.data.data["batch_size"] for o in burst] == [4, 4, 4, 4]
    assert lone.data.data == {"batch_size": 1}
    assert waited >= 0.18


@pytest.mark.parametrize(("max_batch_size", "expected"), [(8, [5]), (3, [3, 2])])
def test_backlog_batches_fully(max_batch_size: int, expected: list[int]) -> None:
    sizes: list[int] = []

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        sizes.append(len(payloads))
        return payloads

    def one(payload: StagePayload) -> StagePayload:
        sizes.append(1)
        return payload

    scheduler = SimpleScheduler(one, batch_compute_fn=batch, max_batch_size=max_batch_size)
    for i in range(5):
        scheduler.inbox.put(new_request(f"r{i}"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 5)
    assert sizes == expected
    assert [o.request_id for o in outs] == [f"r{i}" for i in range(5)]


def test_max_batch_cost_admits_first_and_pushes_overflow_to_front() -> None:
    calls: list[list[str]] = []

    def one(payload: StagePayload) -> StagePayload:
        calls.append([payload.request_id])
        return payload

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        calls.append([p.request_id for p in payloads])
        return payloads

    scheduler = SimpleScheduler(
        one,
        batch_compute_fn=batch,
        max_batch_size=8,
        request_cost_fn=lambda p: p.data,
        max_batch_cost=10,
    )
    for request_id, cost in [("a", 15), ("b", 4), ("c", 5), ("d", 3)]:
        scheduler.inbox.put(new_request(request_id, cost))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 4)
    # "a" alone exceeds the cap yet runs; "b" overflowed and led the next batch; "d" likewise.
    assert calls == [["a"], ["b", "c"], ["d"]]
    assert [o.request_id for o in outs] == ["a", "b", "c", "d"]


def test_batch_length_mismatch_fails_whole_batch() -> None:
    scheduler = SimpleScheduler(lambda p: p, batch_compute_fn=lambda payloads: payloads[:1], max_batch_size=4)
    scheduler.inbox.put(new_request("r1"))
    scheduler.inbox.put(new_request("r2"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 2)
    assert [(o.request_id, o.type) for o in outs] == [("r1", "error"), ("r2", "error")]
    assert isinstance(outs[0].data, ValueError) and outs[0].data is outs[1].data
    assert str(outs[0].data) == "batch_compute_fn returned 1 results for 2 requests"


def test_exception_in_batch_result_fails_only_that_request() -> None:
    bad = ValueError("bad item")
    scheduler = SimpleScheduler(lambda p: p, batch_compute_fn=lambda payloads: [payloads[0], bad], max_batch_size=4)
    scheduler.inbox.put(new_request("r1"))
    scheduler.inbox.put(new_request("r2"))
    with serving(scheduler):
        first, second = get_n(scheduler.outbox, 2)
    assert (first.request_id, first.type) == ("r1", "result")
    assert (second.request_id, second.type, second.data) == ("r2", "error", bad)


def test_aborted_requests_never_enter_a_batch_and_callback_runs_once() -> None:
    batches: list[list[str]] = []
    aborted: list[str] = []

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        batches.append([p.request_id for p in payloads])
        return payloads

    scheduler = SimpleScheduler(lambda p: p, batch_compute_fn=batch, max_batch_size=8, abort_callback=aborted.append)
    for request_id in ["r1", "r2", "r3"]:
        scheduler.inbox.put(new_request(request_id))
    scheduler.abort("r2")
    scheduler.abort("r2")
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 2)
    assert batches == [["r1", "r3"]]
    assert [o.request_id for o in outs] == ["r1", "r3"]
    scheduler.abort("r2")  # a late repeat, after the request was skipped
    assert aborted == ["r2"]


def test_abort_during_compute_drops_output_and_callback_runs_once() -> None:
    running, release = threading.Event(), threading.Event()
    aborted: list[str] = []

    def compute(payload: StagePayload) -> StagePayload:
        if payload.request_id == "slow":
            running.set()
            release.wait(TIMEOUT)
        return payload

    scheduler = SimpleScheduler(compute, abort_callback=aborted.append)
    with serving(scheduler):
        scheduler.enqueue(new_request("slow"))
        assert running.wait(TIMEOUT)
        scheduler.abort("slow")
        scheduler.abort("slow")
        release.set()
        scheduler.enqueue(new_request("next"))
        out = get(scheduler.outbox)
    assert out.request_id == "next"
    assert aborted == ["slow"]


def test_concurrent_mode_runs_max_concurrency_at_once() -> None:
    # The barrier only opens when three computes run at the same time.
    barrier = threading.Barrier(3, timeout=TIMEOUT)

    def compute(payload: StagePayload) -> StagePayload:
        barrier.wait()
        return payload

    scheduler = SimpleScheduler(compute, max_concurrency=3)
    with serving(scheduler):
        for i in range(3):
            scheduler.enqueue(new_request(f"r{i}"))
        outs = get_n(scheduler.outbox, 3)
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2"]
    assert all(o.type == "result" for o in outs)


def test_concurrent_mode_rejects_batch_compute_fn() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        SimpleScheduler(lambda p: p, batch_compute_fn=lambda ps: ps, max_concurrency=2)


def test_concurrent_mode_async_compute_and_errors() -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        await asyncio.sleep(0)
        if payload.data == "bad":
            raise KeyError("bad")
        return payload

    scheduler = SimpleScheduler(compute, max_concurrency=2)
    with serving(scheduler):
        scheduler.enqueue(new_request("ok", "ok"))
        scheduler.enqueue(new_request("bad", "bad"))
        outs = {o.request_id: o.type for o in get_n(scheduler.outbox, 2)}
    assert outs == {"ok": "result", "bad": "error"}


def test_concurrent_stop_loses_nothing_and_joins_workers() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    def compute(payload: StagePayload) -> StagePayload:
        started.release()
        release.wait(TIMEOUT)
        return payload

    scheduler = SimpleScheduler(compute, max_concurrency=2)
    thread = threading.Thread(target=scheduler.start, name="sched-under-test", daemon=True)
    thread.start()
    for i in range(5):
        scheduler.enqueue(new_request(f"r{i}"))
    assert started.acquire(timeout=TIMEOUT) and started.acquire(timeout=TIMEOUT)
    scheduler.stop()
    release.set()
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("sched-under-test-worker")]
    results = []
    while not scheduler.outbox.empty():
        results.append(scheduler.outbox.get_nowait().request_id)
    left = [m.request_id for m in list(scheduler.inbox.queue) if m.type == "new_request"]
    # Every request was either computed or is still in the inbox.
    assert sorted(results + left) == [f"r{i}" for i in range(5)]


@pytest.mark.parametrize("max_concurrency", [1, 3])
def test_stop_wakes_blocked_start_promptly(max_concurrency: int) -> None:
    shutdowns: list[int] = []
    scheduler = SimpleScheduler(
        lambda p: p, max_concurrency=max_concurrency, shutdown_callback=lambda: shutdowns.append(1)
    )
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    served_one(scheduler)  # start() now blocks on the inbox
    scheduler.stop()
    thread.join(2)
    assert not thread.is_alive()
    scheduler.stop()
    assert shutdowns == [1]


def test_stop_wakes_a_batching_window() -> None:
    scheduler = batch_size_scheduler(max_batch_size=4, max_batch_wait_ms=60_000, batch_wait_when_idle=True)
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    taken = threading.Event()
    assert isinstance(scheduler.inbox, Inbox)
    scheduler.inbox.put_tracked(new_request("r1"), taken.set)
    assert taken.wait(TIMEOUT)  # r1 opened the window: the loop now waits 60 s for joiners
    scheduler.stop()
    thread.join(2)
    assert not thread.is_alive()
    # The request already taken still ran.
    assert get(scheduler.outbox).request_id == "r1"


def test_stop_before_start_makes_start_return() -> None:
    scheduler = SimpleScheduler(lambda p: p)
    scheduler.stop()
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    thread.join(2)
    assert not thread.is_alive()


def test_abort_callback_errors_are_logged_not_raised() -> None:
    def callback(request_id: str) -> None:
        raise RuntimeError("cleanup failed")

    scheduler = SimpleScheduler(lambda p: p, abort_callback=callback)
    scheduler.abort("r1")
    assert scheduler.is_aborted("r1")


# ----------------------------------------------------------------------------- inline mode


def test_inline_compute_runs_in_enqueue_on_the_calling_thread() -> None:
    seen: list[int] = []

    def compute(payload: StagePayload) -> StagePayload:
        seen.append(threading.get_ident())
        return tag(payload, "done")

    scheduler = SimpleScheduler(compute, inline=True)
    scheduler.enqueue(new_request("r1"))
    # No serving thread: the result is already there.
    out = scheduler.outbox.get_nowait()
    assert (out.request_id, out.type, out.data.data) == ("r1", "result", "done")
    assert seen == [threading.get_ident()]


def test_inline_compute_errors_fail_only_their_request() -> None:
    def compute(payload: StagePayload) -> StagePayload:
        if payload.data == "poison":
            raise ValueError("bad input")
        return payload

    scheduler = SimpleScheduler(compute, inline=True)
    scheduler.enqueue(new_request("bad", "poison"))
    scheduler.enqueue(new_request("good", "fine"))
    bad, good = scheduler.outbox.get_nowait(), scheduler.outbox.get_nowait()
    assert (bad.request_id, bad.type) == ("bad", "error") and isinstance(bad.data, ValueError)
    assert (good.request_id, good.type) == ("good", "result")


def test_inline_refuses_an_async_compute_fn_with_a_hint() -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        return payload

    scheduler = SimpleScheduler(compute, inline=True)
    scheduler.enqueue(new_request("r1"))
    out = scheduler.outbox.get_nowait()
    assert out.type == "error" and isinstance(out.data, TypeError)
    assert "inline compute must be synchronous" in str(out.data) and "drop inline=True" in str(out.data)


def test_inline_skips_aborted_requests() -> None:
    calls: list[str] = []
    scheduler = SimpleScheduler(lambda payload: calls.append(payload.request_id), inline=True)
    scheduler.abort("r1")
    scheduler.enqueue(new_request("r1"))
    assert calls == [] and scheduler.outbox.empty()


@pytest.mark.parametrize(
    "options", [{"batch_compute_fn": lambda payloads: payloads, "max_batch_size": 4}, {"max_concurrency": 2}]
)
def test_inline_excludes_batching_and_concurrency(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="inline=True runs compute_fn on the stage's event loop"):
        SimpleScheduler(lambda payload: payload, inline=True, **options)


def test_inline_scheduler_thread_still_stops() -> None:
    scheduler = SimpleScheduler(lambda payload: payload, inline=True)
    with serving(scheduler):
        scheduler.enqueue(new_request("r1"))
        assert get(scheduler.outbox).request_id == "r1"
