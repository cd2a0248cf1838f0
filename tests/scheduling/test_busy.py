"""BusyTime: the built-in schedulers time user compute, and only that, in compute-seconds.

Each compute here sleeps a known time, so the totals have a floor; only
lower bounds and the "not counted twice" upper bounds that hold on a loaded
machine are asserted.
"""

from __future__ import annotations

import threading
import time

import pytest

from omni_trio.payload import StreamItem
from omni_trio.scheduling import (
    BusyTime,
    OutgoingMessage,
    SimpleScheduler,
    StreamingSimpleScheduler,
    ThreadedSimpleScheduler,
)

from .helpers import chunk, done, get_n, new_request, serving

NAP = 0.05


def _nap(payload: object) -> object:
    time.sleep(NAP)
    return payload


def test_busy_time_adds_every_call_even_one_that_raises() -> None:
    busy = BusyTime()

    def fail() -> None:
        time.sleep(NAP)
        raise RuntimeError("boom")

    assert busy.call(_nap, 1) == 1
    with pytest.raises(RuntimeError):
        busy.call(fail)
    assert busy.seconds >= 2 * NAP


def test_concurrent_calls_add_up_to_compute_seconds() -> None:
    busy = BusyTime()
    threads = [threading.Thread(target=busy.call, args=(_nap, i)) for i in range(4)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    wall = time.perf_counter() - started
    assert busy.seconds >= 4 * NAP
    assert busy.seconds <= 4 * wall  # each thread adds its own call, never more


@pytest.mark.parametrize("concurrency", [1, 4])
def test_simple_scheduler_times_its_compute(concurrency: int) -> None:
    scheduler = SimpleScheduler(_nap, max_concurrency=concurrency)
    assert scheduler.busy.seconds == 0
    with serving(scheduler):
        for i in range(4):
            scheduler.enqueue(new_request(f"r{i}", i))
        assert sorted(out.request_id for out in get_n(scheduler.outbox, 4)) == ["r0", "r1", "r2", "r3"]
    assert scheduler.busy.seconds >= 4 * NAP


def test_a_batch_is_timed_once_and_its_window_is_not() -> None:
    batches: list[int] = []

    def batch(payloads: list[object]) -> list[object]:
        batches.append(len(payloads))
        time.sleep(NAP)
        return payloads

    # A long window: the lone request waits in it for a partner that never comes.
    scheduler = SimpleScheduler(_nap, batch_compute_fn=batch, max_batch_size=4, max_batch_wait_ms=300,
                                batch_wait_when_idle=True)
    started = time.perf_counter()
    with serving(scheduler):
        scheduler.enqueue(new_request("r0"))
        get_n(scheduler.outbox, 1)
    assert time.perf_counter() - started >= 0.3
    assert NAP <= scheduler.busy.seconds < 0.3


def test_threaded_scheduler_times_its_pool_threads() -> None:
    scheduler = ThreadedSimpleScheduler(_nap, max_concurrency=4)
    with serving(scheduler):
        for i in range(4):
            scheduler.enqueue(new_request(f"r{i}", i))
        get_n(scheduler.outbox, 4)
    assert scheduler.busy.seconds >= 4 * NAP


class Napper(StreamingSimpleScheduler):
    """Naps in every hook; ``batched`` overrides the chunk-batch hook."""

    def __init__(self, batched: bool = False) -> None:
        super().__init__(compute_fn=None)
        self.can_batch_stream_chunks = batched
        self.chunk_calls = 0

    def is_streaming_payload(self, payload: object) -> bool:
        return True

    def on_streaming_new_request(self, request_id: str, payload: object) -> None:
        time.sleep(NAP)

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        self.chunk_calls += 1
        time.sleep(NAP)
        return [OutgoingMessage(request_id, "stream", data=item.data)]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        time.sleep(NAP)
        return [OutgoingMessage(request_id, "result", data="done")]


class BatchNapper(Napper):
    """Handles a chunk batch in one nap of its own."""

    def on_stream_chunk_batch(self, items: list[tuple[str, StreamItem]]) -> None:
        time.sleep(NAP)
        for request_id, item in items:
            self.outbox.put(OutgoingMessage(request_id, "stream", data=item.data))


@pytest.mark.parametrize(("scheduler_class", "batched", "naps"),
                         [(Napper, False, 5), (Napper, True, 5), (BatchNapper, True, 3)])
def test_streaming_hooks_are_timed_once_each(scheduler_class: type[Napper], batched: bool, naps: int) -> None:
    scheduler = scheduler_class(batched=batched)
    # Queued before the loop starts, so the three chunks reach the batch hook together.
    for message in [new_request("r0"), chunk("r0", 0, 1), chunk("r0", 1, 2), chunk("r0", 2, 3), done("r0")]:
        scheduler.enqueue(message)
    started = time.perf_counter()
    with serving(scheduler):
        outputs = get_n(scheduler.outbox, 4)
    wall = time.perf_counter() - started
    assert [out.type for out in outputs] == ["stream", "stream", "stream", "result"]
    # The new request, three chunks (or one batch), the done: each once. The default batch hook
    # runs the timed chunk hook, and is not timed around it too: the total stays within the wall time.
    assert naps * NAP <= scheduler.busy.seconds <= wall
