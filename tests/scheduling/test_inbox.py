"""Inbox: a queue.Queue that reports when a tracked message leaves it (taken or purged)."""

from __future__ import annotations

import queue
import threading

from omni_trio.scheduling import IncomingMessage
from omni_trio.scheduling.inbox import Inbox


def msg(request_id: str, i: int = 0) -> IncomingMessage:
    return IncomingMessage(request_id, "stream_chunk", data=i)


def test_it_is_a_queue_and_untracked_messages_behave_as_usual() -> None:
    inbox = Inbox()
    assert isinstance(inbox, queue.Queue)
    inbox.put(msg("a"))
    assert inbox.get_nowait().request_id == "a"
    assert inbox.tracked == 0


def test_a_tracked_message_reports_its_take_once_on_the_taking_thread() -> None:
    inbox = Inbox()
    taken: list[tuple[int, str]] = []
    first, second = msg("a", 1), msg("a", 2)
    inbox.put(msg("a", 0))
    inbox.put_tracked(first, lambda: taken.append((1, threading.current_thread().name)))
    inbox.put_tracked(second, lambda: taken.append((2, threading.current_thread().name)))
    assert inbox.tracked == 2 and inbox.qsize() == 3
    assert inbox.get().data == 0 and taken == []

    def take() -> None:
        assert inbox.get().data == 1

    thread = threading.Thread(target=take, name="scheduler-x")
    thread.start()
    thread.join(timeout=5)
    assert taken == [(1, "scheduler-x")]
    assert inbox.get_nowait().data == 2
    assert [n for n, _ in taken] == [1, 2] and inbox.tracked == 0


def test_purge_drops_a_request_and_reports_its_tracked_messages() -> None:
    inbox = Inbox()
    reported: list[int] = []
    inbox.put(msg("a", 0))
    inbox.put_tracked(msg("a", 1), lambda: reported.append(1))
    inbox.put_tracked(msg("b", 2), lambda: reported.append(2))
    assert inbox.purge("a") == 2
    assert reported == [1]
    assert inbox.qsize() == 1 and inbox.unfinished_tasks == 1 and inbox.tracked == 1
    assert inbox.get_nowait().data == 2 and reported == [1, 2]
    assert inbox.purge("nobody") == 0


def test_put_all_queues_a_run_in_order_and_tracks_its_last_message() -> None:
    inbox = Inbox(maxsize=1)  # a run is never refused or held back by maxsize
    taken: list[str] = []
    inbox.put_all([msg("a", i) for i in range(3)], lambda: taken.append("run"))
    inbox.put_all([])  # nothing to queue, nothing to track
    assert inbox.qsize() == 3 and inbox.tracked == 1
    assert [inbox.get_nowait().data for _ in range(2)] == [0, 1] and taken == []
    assert inbox.get_nowait().data == 2 and taken == ["run"]


def test_put_all_wakes_a_waiting_scheduler() -> None:
    inbox = Inbox()
    got: list[int] = []

    def take() -> None:
        got.append(inbox.get(timeout=5).data)

    waiter = threading.Thread(target=take)
    waiter.start()
    inbox.put_all([msg("a", 7), msg("a", 8)])
    waiter.join(timeout=5)
    assert got == [7] and inbox.get_nowait().data == 8
