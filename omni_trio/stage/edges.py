"""Per-edge send lanes: a slow consumer on one edge does not stall a stage's other edges.

A stage's drain routes its scheduler's outputs in order. Routed inline, a send
that waits (for a shared-memory credit of a stalled consumer, for a full socket)
stalls every other destination of the stage. A stage with more than one edge
(``stream_to`` targets, ``next`` stages and, for a terminal stage, the caller)
therefore hands its sends to one lane per destination: a task that sends that
destination's messages in order, so each edge flows at its own consumer's pace.

* Stream chunks go to their destination's lane (a fan-out to each one's).
* A result is routed by its own task, and each of its sends (the stream-done
  signal, the payload, the caller's completion) goes on its destination's lane:
  it never overtakes the request's chunks there, and a result waiting for a
  slow stage holds up neither the drain nor the other edges.
* Bounded: a lane holds at most :data:`LANE_CHUNKS` unsent chunks and at most
  :data:`RESULTS_IN_FLIGHT` results are being routed; past that the drain waits
  (and with it the scheduler's bounded outbox), so memory stays bounded and a
  consumer stalled for good does, in the end, slow its producer down.

A stage with a single edge keeps the inline drain: no task, no hand-off.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable

import attrs
import outcome
import trio

from omni_trio.config import StageConfig

#: Unsent stream chunks one lane may hold before the drain waits for it.
LANE_CHUNKS = 64
#: Results being routed at once (each waits for its request's chunks, then sends).
RESULTS_IN_FLIGHT = 64

Work = Callable[[], Awaitable[None]]


def edge_count(config: StageConfig) -> int:
    """How many destinations a stage may send to: its ``stream_to`` and ``next`` stages, and the
    caller if it is terminal (``route_fn`` chooses among ``next``: no more edges)."""
    edges = set(config.stream_to) | set(config.next_stages)
    return len(edges) + (1 if config.terminal else 0)


@attrs.define(eq=False)
class _Lane:
    items: collections.deque[tuple[int, Work]] = attrs.field(factory=collections.deque)
    #: Chunks queued or being sent.
    queued: int = 0
    has_items: trio.Event = attrs.field(factory=trio.Event)
    room: trio.Event = attrs.field(factory=trio.Event)


class EdgeQueues:
    """The lanes of one stage, run as tasks of ``nursery`` (see the module docstring)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._lanes: dict[str, _Lane] = {}
        self._results = trio.Semaphore(RESULTS_IN_FLIGHT)
        #: Lane items queued or being sent.
        self._items = 0
        #: Lane items plus results being routed; :meth:`flush` waits for 0.
        self._outstanding = 0
        self._drained = trio.Event()

    @property
    def queued(self) -> int:
        """Lane items queued or being sent (a result being routed holds its request active instead)."""
        return self._items

    async def send(self, destination: str, chunks: int, work: Work) -> None:
        """Queue ``work`` (sending ``chunks`` chunks) on ``destination``'s lane, waiting while that
        lane is full (an item larger than a lane goes alone)."""
        lane = self._lanes.get(destination)
        if lane is None:
            lane = self._lanes[destination] = _Lane()
            self._nursery.start_soon(self._serve, lane)
        while lane.queued and lane.queued + chunks > LANE_CHUNKS:
            lane.room = trio.Event()
            await lane.room.wait()
        lane.items.append((chunks, work))
        lane.queued += chunks
        self._items += 1
        self._outstanding += 1
        lane.has_items.set()

    async def call(self, destination: str, work: Work) -> None:
        """Run ``work`` on ``destination``'s lane, after what is queued there; return (or raise) as it does."""
        finished = trio.Event()
        result: list[outcome.Outcome[None]] = []

        async def run() -> None:
            result.append(await outcome.acapture(work))
            finished.set()

        await self.send(destination, 0, run)
        await finished.wait()
        result[0].unwrap()

    async def fan_out(self, sends: dict[str, Work]) -> None:
        """Run each ``sends[destination]`` on its destination's lane, all at once; raise the first
        error (a cancellation only when there is no other)."""
        try:
            async with trio.open_nursery() as nursery:
                for destination, work in sends.items():
                    nursery.start_soon(self.call, destination, work)
        except BaseExceptionGroup as group:
            errors = [error for error in group.exceptions if not isinstance(error, trio.Cancelled)]
            raise (errors or list(group.exceptions))[0] from None

    async def reached(self, destination: str) -> None:
        """Return once ``destination``'s lane sent everything queued on it so far."""
        if destination in self._lanes:
            await self.call(destination, trio.lowlevel.checkpoint)

    async def _serve(self, lane: _Lane) -> None:
        while True:
            if not lane.items:
                lane.has_items = trio.Event()
                await lane.has_items.wait()
                continue
            chunks, work = lane.items.popleft()
            try:
                await work()
            finally:
                lane.queued -= chunks
                lane.room.set()
                self._items -= 1
                self._finished()

    def _finished(self) -> None:
        self._outstanding -= 1
        if not self._outstanding:
            self._drained.set()

    async def route(self, work: Work) -> None:
        """Run ``work`` (routing one result) in its own task (waits while :data:`RESULTS_IN_FLIGHT` run)."""
        await self._results.acquire()
        self._outstanding += 1
        self._nursery.start_soon(self._route, work)

    async def _route(self, work: Work) -> None:
        try:
            await work()
        finally:
            self._results.release()
            self._finished()

    async def flush(self) -> None:
        """Return once every lane is empty and no result is being routed (the stage stops)."""
        while self._outstanding:
            self._drained = trio.Event()
            await self._drained.wait()
