"""The stage's drain sources (omni_trio/stage/bridge.py): what waited for goes alone, the backlog coalesces."""

from __future__ import annotations

import queue
import threading

import pytest
import trio
import trio.testing

from omni_trio.scheduling import Outbox, OutgoingMessage
from omni_trio.stage.bridge import DRAIN_BATCH, OutboxPump, OutboxWaiter


def chunk(i: int) -> OutgoingMessage:
    return OutgoingMessage("r", "stream", data=i)


def ids(batch: list[OutgoingMessage]) -> list[int]:
    return [m.data for m in batch]


async def test_the_waiter_hands_over_the_first_put_alone_and_coalesces_the_rest() -> None:
    outbox = Outbox()
    waiter = OutboxWaiter(outbox)
    batches: list[list[OutgoingMessage]] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def drain_one() -> None:
                batches.append(await waiter.next_batch())

            nursery.start_soon(drain_one)
            await trio.testing.wait_all_tasks_blocked()  # the waiter found the outbox empty and armed it
            for i in range(3):  # on the loop, so the waiter cannot run in between
                outbox.put(chunk(i))
        assert ids(batches[0]) == [0]
        for i in range(3, DRAIN_BATCH + 5):
            outbox.put(chunk(i))
        assert ids(await waiter.next_batch()) == list(range(1, DRAIN_BATCH + 1))  # queued: a full batch
        assert ids(await waiter.next_batch()) == list(range(DRAIN_BATCH + 1, DRAIN_BATCH + 5))


async def test_a_producer_thread_gated_after_its_first_chunk_still_gets_it_delivered() -> None:
    # The first chunk reaches the drain before the producer has put the second one.
    outbox = Outbox()
    waiter = OutboxWaiter(outbox)
    gate = threading.Event()

    def produce() -> None:
        outbox.put(chunk(0))
        gate.wait()
        for i in range(1, 6):
            outbox.put(chunk(i))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, produce)
            assert ids(await waiter.next_batch()) == [0]
            gate.set()
            received = [0]
            while len(received) < 6:
                received += ids(await waiter.next_batch())
    assert received == list(range(6))


async def test_the_waiter_wakes_for_puts_from_the_loop_and_from_threads_in_any_order() -> None:
    # It waits on its doorbell after a thread's put and on a trio event after the loop's own put; a put
    # of the other kind must wake it all the same.
    import os

    outbox = Outbox()
    waiter = OutboxWaiter(outbox)
    fd = waiter._bell._fd  # the test checks that close() releases it
    order = ["thread", "thread", "loop", "loop", "thread", "loop", "thread"]
    with trio.fail_after(10):
        for i, where in enumerate(order):
            async with trio.open_nursery() as nursery:

                async def drain_one(expected: int = i) -> None:
                    assert ids(await waiter.next_batch()) == [expected]

                nursery.start_soon(drain_one)
                await trio.testing.wait_all_tasks_blocked()  # the waiter armed the outbox and sleeps
                if where == "loop":
                    outbox.put(chunk(i))
                else:
                    await trio.to_thread.run_sync(outbox.put, chunk(i))
    waiter.close()
    with pytest.raises(OSError):  # close() released the doorbell's eventfd
        os.fstat(fd)


class _Entered(queue.Queue[OutgoingMessage]):
    """A queue that says when a blocking ``get`` began (the pump is idle)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> OutgoingMessage:
        if block:
            self.waiting.set()
        return super().get(block, timeout)


async def test_the_pump_hands_over_what_it_waited_for_alone() -> None:
    outbox = _Entered()
    pump = OutboxPump("s", outbox)
    pump.start()
    try:
        with trio.fail_after(10):
            await trio.to_thread.run_sync(outbox.waiting.wait)
            with outbox.mutex:  # all at once: the pump's get returns with the rest already queued
                outbox.queue.extend(chunk(i) for i in range(4))
                outbox.not_empty.notify()
            assert ids(await pump.next_batch()) == [0]
            assert ids(await pump.next_batch()) == [1, 2, 3]
    finally:
        pump.close()
        outbox.put(OutgoingMessage("", "wakeup"))
