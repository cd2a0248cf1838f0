"""Outbox: a queue.Queue that wakes its stage on put (no pump thread)."""

from __future__ import annotations

import queue
import threading

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
