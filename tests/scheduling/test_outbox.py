"""Outbox: a queue.Queue that wakes its stage on put (no pump thread)."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator

import pytest

from omni_trio.scheduling import Outbox, OutgoingMessage


def out(request_id: str) -> OutgoingMessage:
    return OutgoingMessage(request_id, "result", data=request_id)


def test_it_is_a_queue() -> None:
    outbox = Outbox(maxsize=1)
    assert isinstance(outbox, queue.Queue)
    outbox.put(out("a"))
    with pytest.raises(queue.Full):
        outbox.put(out("b"), timeout=0.01)
    assert outbox.get_nowait().request_id == "a"


def test_take_returns_up_to_the_limit_in_order() -> None:
    outbox = Outbox()
    for i in range(5):
        outbox.put(out(f"r{i}"))
    fired: list[str] = []
    first = outbox.take_or_arm(3, lambda: fired.append("woken"))
    rest = outbox.take_or_arm(3, lambda: fired.append("woken"))
    assert [m.request_id for m in first] == ["r0", "r1", "r2"]
    assert [m.request_id for m in rest] == ["r3", "r4"]
    assert fired == []


def test_an_empty_take_arms_the_next_put_once() -> None:
    outbox = Outbox()
    fired: list[int] = []
    # The callback runs under the outbox's lock: it may look at the deque, not call the queue.
    assert outbox.take_or_arm(64, lambda: fired.append(len(outbox.queue))) == []
    outbox.put(out("a"))
    outbox.put(out("b"))
    # Called once, after the first message was queued (so the woken side finds it).
    assert fired == [1]


def test_disarm_forgets_the_callback() -> None:
    outbox = Outbox()
    fired: list[str] = []
    outbox.take_or_arm(64, lambda: fired.append("woken"))
    outbox.disarm()
    outbox.put(out("a"))
    assert fired == []


def test_a_put_on_another_thread_runs_the_callback_there() -> None:
    outbox = Outbox()
    threads: list[str] = []
    outbox.take_or_arm(64, lambda: threads.append(threading.current_thread().name))
    putter = threading.Thread(target=outbox.put, args=(out("a"),), name="scheduler-x")
    putter.start()
    putter.join(timeout=10)
    assert threads == ["scheduler-x"]


def test_taking_frees_room_for_a_blocked_put() -> None:
    outbox = Outbox(maxsize=1)
    outbox.put(out("a"))
    putter = threading.Thread(target=outbox.put, args=(out("b"),))
    putter.start()
    assert [m.request_id for m in outbox.take_or_arm(64, lambda: None)] == ["a"]
    putter.join(timeout=10)
    assert not putter.is_alive()
    assert outbox.get_nowait().request_id == "b"


# ---------------------------------------------------------------------------- the stream bound


def chunk(request_id: str, i: int = 0) -> OutgoingMessage:
    return OutgoingMessage(request_id, "stream", data=i)


def put_in_thread(outbox: Outbox, message: OutgoingMessage) -> tuple[threading.Thread, threading.Event]:
    """Put ``message`` from another thread; the event is set once the put returned."""
    done = threading.Event()

    def body() -> None:
        outbox.put(message)
        done.set()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, done


def test_a_stream_put_past_the_bound_waits_for_a_take() -> None:
    outbox = Outbox(max_queued_streams=2)
    outbox.put(chunk("a", 0))
    outbox.put(chunk("a", 1))
    with pytest.raises(queue.Full):
        outbox.put(chunk("a", 2), block=False)
    with pytest.raises(queue.Full):
        outbox.put(chunk("a", 2), timeout=0.01)
    # Results, errors and the wakeup sentinel never wait.
    outbox.put(out("a"))
    outbox.put(OutgoingMessage("a", "error", data="x"))
    outbox.put(OutgoingMessage("", "wakeup"))
    thread, done = put_in_thread(outbox, chunk("a", 2))
    assert not done.wait(0.05)  # blocked: two chunks queued
    assert outbox.queued_streams == 2
    taken = outbox.take_or_arm(1, lambda: None)
    assert [m.data for m in taken] == [0]
    thread.join(timeout=5)
    assert done.is_set()
    assert [(m.type, m.data) for m in outbox.take_or_arm(64, lambda: None)] == [
        ("stream", 1), ("result", "a"), ("error", "x"), ("wakeup", None), ("stream", 2)
    ]
    assert outbox.queued_streams == 0


def test_get_frees_room_too() -> None:
    outbox = Outbox(max_queued_streams=1)
    outbox.put(chunk("a", 0))
    thread, done = put_in_thread(outbox, chunk("a", 1))
    assert not done.wait(0.05)
    assert outbox.get().data == 0
    thread.join(timeout=5)
    assert done.is_set() and outbox.queued_streams == 1


def test_puts_on_the_stage_loop_thread_never_wait() -> None:
    outbox = Outbox(max_queued_streams=1)
    outbox.attach(threading.get_ident())  # this thread stands for the stage's event loop (inline compute)
    for i in range(10):
        outbox.put(chunk("a", i))
    assert outbox.queued_streams == 10


def test_stop_blocking_lets_a_waiting_put_through() -> None:
    outbox = Outbox(max_queued_streams=1)
    outbox.put(chunk("a", 0))
    thread, done = put_in_thread(outbox, chunk("a", 1))
    assert not done.wait(0.05)
    outbox.stop_blocking()
    thread.join(timeout=5)
    assert done.is_set()
    outbox.put(chunk("a", 2), block=False)  # no bound any more
    assert outbox.queued_streams == 3


def test_discarding_a_retired_request_frees_its_room_and_drops_its_later_chunks() -> None:
    outbox = Outbox(max_queued_streams=2)
    outbox.put(chunk("a", 0))
    outbox.put(out("a"))
    outbox.put(chunk("b", 0))
    thread, done = put_in_thread(outbox, chunk("a", 1))
    assert not done.wait(0.05)
    assert outbox.discard_streams("a") == 1
    thread.join(timeout=5)
    assert done.is_set()
    outbox.put(chunk("a", 2), block=False)  # dropped: the request is retired
    # The result stays (the stage releases a retired request's result itself), the other request's chunk too.
    assert [(m.request_id, m.type) for m in outbox.take_or_arm(64, lambda: None)] == [("a", "result"), ("b", "stream")]
    assert outbox.queued_streams == 0 and outbox.unfinished_tasks == 2


def test_retiring_many_requests_drops_their_chunks_in_one_call_and_later_puts_too() -> None:
    outbox = Outbox(max_queued_streams=8)
    for rid in ("a", "b", "c"):
        outbox.put(chunk(rid, 0))
        outbox.put(out(rid))
    assert outbox.discard_streams("a", "c") == 2
    outbox.put(chunk("c", 1), block=False)  # retired: dropped
    taken = [(m.request_id, m.type) for m in outbox.take_or_arm(64, lambda: None)]
    assert taken == [("a", "result"), ("b", "stream"), ("b", "result"), ("c", "result")]
    # Without a stream queued there is nothing to sweep, but the ids are still retired.
    assert outbox.discard_streams("b") == 0
    outbox.put(chunk("b", 1), block=False)
    assert outbox.queued_streams == 0 and outbox.take_or_arm(64, lambda: None) == []


def test_the_bound_is_validated() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_queued_streams"):
            Outbox(max_queued_streams=bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the first chunk's hand-over


@pytest.fixture
def long_switch_interval() -> Iterator[None]:
    """A GIL switch interval longer than the test: a handed-over put waits for the drain, not the clock."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def arm(outbox: Outbox) -> None:
    """Stand for the idle drain: it found the outbox empty and armed it."""
    assert outbox.take_or_arm(64, lambda: None) == []


def test_a_first_chunk_that_wakes_the_idle_drain_waits_until_it_was_sent(long_switch_interval: None) -> None:
    outbox = Outbox()
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("a", 0))
    assert not done.wait(0.05)  # queued, and its producer waits for the send
    assert [m.data for m in outbox.take_or_arm(64, lambda: None)] == [0]
    assert not done.wait(0.05)  # taken is not sent
    outbox.batch_sent()
    thread.join(timeout=5)
    assert done.is_set()
    # Once per request: its later chunks never wait, even when they wake the idle drain again.
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("a", 1))
    thread.join(timeout=5)
    assert done.is_set()
    # Another request's first chunk is handed over in its turn.
    assert [m.data for m in outbox.take_or_arm(64, lambda: None)] == [1]
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("b", 0))
    assert not done.wait(0.05)
    outbox.batch_sent()
    thread.join(timeout=5)
    assert done.is_set()


def test_only_a_threads_stream_put_that_wakes_the_drain_is_handed_over(long_switch_interval: None) -> None:
    outbox = Outbox()
    # The drain is busy (not armed): nothing to hand over to.
    thread, done = put_in_thread(outbox, chunk("a", 0))
    thread.join(timeout=5)
    assert done.is_set()
    outbox.take_or_arm(64, lambda: None)
    # A result wakes the drain without waiting.
    arm(outbox)
    thread, done = put_in_thread(outbox, out("b"))
    thread.join(timeout=5)
    assert done.is_set()
    outbox.take_or_arm(64, lambda: None)
    # A put on the stage's own loop never waits (the drain could not run meanwhile).
    outbox.attach(threading.get_ident())
    arm(outbox)
    outbox.put(chunk("c", 0))
    assert outbox.queued_streams == 1


def test_a_handed_over_put_ends_when_the_stage_stops_or_drops_the_request(long_switch_interval: None) -> None:
    outbox = Outbox()
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("a", 0))
    assert not done.wait(0.05)
    outbox.discard_streams("b")  # another request's retirement does not end it
    assert not done.wait(0.05)
    outbox.discard_streams("a")
    thread.join(timeout=5)
    assert done.is_set()
    outbox.take_or_arm(64, lambda: None)
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("c", 0))
    assert not done.wait(0.05)
    outbox.stop_blocking()
    thread.join(timeout=5)
    assert done.is_set()


def test_a_handed_over_put_waits_one_switch_interval_at_most() -> None:
    # The GIL would let the drain run by then anyway; a drain that never says "sent" cannot hold the producer.
    outbox = Outbox()
    arm(outbox)
    thread, done = put_in_thread(outbox, chunk("a", 0))
    thread.join(timeout=5)
    assert done.is_set()
    assert outbox.queued_streams == 1
