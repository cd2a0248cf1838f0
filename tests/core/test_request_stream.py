"""A streaming caller's reads: queued events are taken without a scheduler trip, fairly and cancellably."""

from __future__ import annotations

import math

import trio

from omni_trio.coordinator.live_request import END_OF_STREAM, LiveRequest
from omni_trio.coordinator.request_stream import EVENTS_PER_YIELD, RequestStream
from omni_trio.coordinator.stream_backlog import StreamBacklog
from omni_trio.errors import RequestError
from omni_trio.events import StreamMessage
from omni_trio.payload import OmniRequest


def queued_stream(chunks: int, aborts: list[RequestError], *, ended: bool) -> RequestStream:
    """A stream whose request already delivered ``chunks`` chunks (and, if ``ended``, finished as the
    coordinator finishes one: resolved, then the end queued); its aborts go to ``aborts``."""
    live = LiveRequest("r0", OmniRequest("x"), frozenset({"voc"}), True)
    live.events, live.received = trio.open_memory_channel[object](math.inf)
    backlog = StreamBacklog(1 << 30)
    for i in range(chunks):
        live.events.send_nowait(StreamMessage("r0", "voc", i, chunk_id=i))
        backlog.queued(live, 0)
    if ended:
        live.done.set()
        live.events.send_nowait(END_OF_STREAM)
        backlog.queued(live, 0)

    async def send(_: LiveRequest) -> None:
        pass

    def abort(live: LiveRequest, error: RequestError) -> trio.Event:
        aborts.append(error)
        live.done.set()
        done = trio.Event()
        done.set()
        return done

    async def settled(_: str) -> None:
        pass

    return RequestStream("r0", admit=lambda: live, send=send, abort=abort, settled=settled,
                         taken=backlog.taken, dropped=backlog.dropped, declared=lambda live, seconds: None)


async def test_a_reader_that_never_waits_still_lets_its_neighbours_run() -> None:
    chunks = 10 * EVENTS_PER_YIELD
    neighbour_steps = 0

    async def neighbour() -> None:
        nonlocal neighbour_steps
        while True:
            neighbour_steps += 1
            await trio.lowlevel.checkpoint()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(neighbour)
            await trio.lowlevel.checkpoint()
            steps_before = neighbour_steps
            stream = queued_stream(chunks, aborts := list[RequestError](), ended=True)
            read = [event.chunk async for event in stream if isinstance(event, StreamMessage)]
            steps_during = neighbour_steps - steps_before
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert read == list(range(chunks)) and aborts == []  # read to its end: nothing to abort
    # Not a trip per chunk (that was the cost), but about one every EVENTS_PER_YIELD.
    assert chunks // EVENTS_PER_YIELD // 2 <= steps_during < chunks // 2


async def test_a_cancelled_reader_stops_at_the_next_event_even_with_events_queued() -> None:
    stream = queued_stream(100, aborts := list[RequestError](), ended=False)
    read = 0
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            async for _ in stream:
                read += 1
                if read == 3:
                    scope.cancel()
    assert read == 3 and scope.cancelled_caught
    assert [type(error).__name__ for error in aborts] == ["RequestAborted"]  # leaving it aborts the request
