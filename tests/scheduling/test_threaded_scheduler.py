"""ThreadedSimpleScheduler (SPEC §5.2)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from omni_trio.payload import StagePayload
from omni_trio.scheduling import Inbox, StageScheduler, ThreadedSimpleScheduler

from .helpers import TIMEOUT, assert_quiet, get, get_n, new_request, served_one, serving


class Gate:
    """A compute function that blocks until released and counts concurrency."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.cond = threading.Condition()
        self.started: list[str] = []
        self.active = 0
        self.max_active = 0

    def __call__(self, payload: StagePayload) -> StagePayload:
        with self.cond:
            self.started.append(payload.request_id)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.cond.notify_all()
        self.release.wait(TIMEOUT)
        with self.cond:
            self.active -= 1
        return payload

    def wait_started(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, TIMEOUT)


def test_satisfies_the_stage_contract() -> None:
    assert isinstance(ThreadedSimpleScheduler(lambda p: p), StageScheduler)


def test_needs_compute_or_dispatch() -> None:
    with pytest.raises(ValueError):
        ThreadedSimpleScheduler()
    with pytest.raises(ValueError):
        ThreadedSimpleScheduler(lambda p: p, max_concurrency=None)


def test_concurrency_cap_leaves_excess_in_the_inbox() -> None:
    gate = Gate()
    scheduler = ThreadedSimpleScheduler(gate, max_concurrency=2)
    with serving(scheduler):
        for i in range(3):
            scheduler.enqueue(new_request(f"r{i}"))
        gate.wait_started(2)
        time.sleep(0.1)
        assert len(gate.started) == 2
        assert scheduler.inbox.qsize() == 1  # the loop did not even take the third
        gate.release.set()
        outs = get_n(scheduler.outbox, 3)
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2"]
    assert gate.max_active == 2


def test_sync_error_and_async_compute() -> None:
    async def compute(payload: StagePayload) -> StagePayload:
        await asyncio.sleep(0)
        if payload.data == "bad":
            raise ValueError("bad")
        return payload

    scheduler = ThreadedSimpleScheduler(compute)
    with serving(scheduler):
        scheduler.enqueue(new_request("ok", "ok"))
        scheduler.enqueue(new_request("bad", "bad"))
        outs = {o.request_id: o for o in get_n(scheduler.outbox, 2)}
    assert outs["ok"].type == "result"
    assert outs["bad"].type == "error" and isinstance(outs["bad"].data, ValueError)


def test_abort_of_queued_request_skips_it() -> None:
    gate = Gate()
    aborted: list[str] = []
    scheduler = ThreadedSimpleScheduler(gate, max_concurrency=1, abort_callback=aborted.append)
    with serving(scheduler):
        scheduler.enqueue(new_request("a"))
        gate.wait_started(1)
        scheduler.enqueue(new_request("b"))  # waits in the inbox: no capacity
        scheduler.abort("b")
        gate.release.set()
        assert get(scheduler.outbox).request_id == "a"
        scheduler.enqueue(new_request("c"))
        assert get(scheduler.outbox).request_id == "c"
    assert gate.started == ["a", "c"]
    assert aborted == ["b"]


def test_abort_of_pending_request_frees_its_slot_at_once() -> None:
    gate = Gate()
    aborted: list[str] = []
    scheduler = ThreadedSimpleScheduler(gate, max_concurrency=1, abort_callback=aborted.append)
    with serving(scheduler):
        scheduler.enqueue(new_request("a"))
        gate.wait_started(1)
        taken = threading.Event()
        assert isinstance(scheduler.inbox, Inbox)
        scheduler.inbox.put_tracked(new_request("b"), taken.set)
        scheduler.abort("a")
        # The slot is free, so "b" is taken and handed to the pool while "a" still runs.
        assert taken.wait(TIMEOUT)
        assert scheduler.inbox.qsize() == 0
        gate.release.set()
        out = get(scheduler.outbox)
        assert_quiet(scheduler.outbox, 0.1)
    assert out.request_id == "b"
    # At abort time, then again when the abandoned compute finished (late side effects).
    assert aborted == ["a", "a"]


def test_abort_before_arrival_is_a_speculative_tombstone() -> None:
    computed: list[str] = []

    def compute(payload: StagePayload) -> StagePayload:
        computed.append(payload.request_id)
        return payload

    scheduler = ThreadedSimpleScheduler(compute)
    scheduler.abort("early")
    with serving(scheduler):
        scheduler.enqueue(new_request("early"))
        scheduler.enqueue(new_request("later"))
        assert get(scheduler.outbox).request_id == "later"
    assert computed == ["later"]


def test_dispatch_fn_without_cap() -> None:
    futures: dict[str, Future[Any]] = {}
    dispatched = threading.Semaphore(0)

    def dispatch(payload: StagePayload) -> Future[Any]:
        future: Future[Any] = Future()
        futures[payload.request_id] = future
        dispatched.release()
        return future

    scheduler = ThreadedSimpleScheduler(dispatch_fn=dispatch, max_concurrency=None)
    with serving(scheduler):
        for i in range(3):
            scheduler.enqueue(new_request(f"r{i}"))
        for _ in range(3):
            assert dispatched.acquire(timeout=TIMEOUT)
        futures["r1"].set_result("one")
        first = get(scheduler.outbox)
        futures["r0"].set_exception(RuntimeError("engine failed"))
        second = get(scheduler.outbox)
        futures["r2"].set_result("two")
        third = get(scheduler.outbox)
    assert (first.request_id, first.type, first.data) == ("r1", "result", "one")
    assert (second.request_id, second.type) == ("r0", "error")
    assert str(second.data) == "engine failed"
    assert (third.request_id, third.data) == ("r2", "two")


def test_stop_wakes_capacity_wait_and_blocked_get() -> None:
    gate = Gate()
    scheduler = ThreadedSimpleScheduler(gate, max_concurrency=1)
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    scheduler.enqueue(new_request("a"))
    gate.wait_started(1)  # the loop now waits for capacity
    scheduler.stop()
    thread.join(2)
    assert not thread.is_alive()
    gate.release.set()

    idle = ThreadedSimpleScheduler(lambda p: p)
    thread = threading.Thread(target=idle.start, daemon=True)
    thread.start()
    served_one(idle)  # now blocked on inbox.get()
    idle.stop()
    thread.join(2)
    assert not thread.is_alive()
