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

What is awaited on a lane (a result's sends, a barrier) runs in the caller's own task when the
lane is idle: nothing queued there and nothing being sent. The lane counts as busy meanwhile, so
what is queued behind it still waits its turn, and no hand-off to the lane's task is paid. A
result's sends to several destinations go at once: each on its lane's task except one, which
the routing task sends itself.
"""

from __future__ import annotations

import collections
import functools
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
    #: Something is being sent on the lane: by its task, or by a caller that found it idle.
    busy: bool = False
    has_items: trio.Event = attrs.field(factory=trio.Event)
    room: trio.Event = attrs.field(factory=trio.Event)


class _Queued:
    """One awaited item on a lane: its outcome once the lane ran it, and who to tell."""

    def __init__(self, on_done: Callable[[bool], None] | None) -> None:
        self.result: outcome.Outcome[None] | None = None
        self._done = trio.Event()
        self._on_done = on_done

    async def run(self, work: Work) -> None:
        """The lane's turn: run ``work``, keep its outcome (the lane's task never raises it)."""
        self.result = await outcome.acapture(work)
        self._done.set()
        if self._on_done is not None:
            self._on_done(isinstance(self.result, outcome.Error))

    async def wait(self) -> None:
        """Wait for the lane's turn, then return or raise as ``work`` did."""
        await self._done.wait()
        assert self.result is not None
        self.result.unwrap()


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

    def _lane(self, destination: str) -> _Lane:
        lane = self._lanes.get(destination)
        if lane is None:
            lane = self._lanes[destination] = _Lane()
            self._nursery.start_soon(self._serve, lane)
        return lane

    async def send(self, destination: str, chunks: int, work: Work) -> None:
        """Queue ``work`` (sending ``chunks`` chunks) on ``destination``'s lane, waiting while that
        lane is full (an item larger than a lane goes alone)."""
        lane = self._lane(destination)
        while lane.queued and lane.queued + chunks > LANE_CHUNKS:
            lane.room = trio.Event()
            await lane.room.wait()
        lane.items.append((chunks, work))
        lane.queued += chunks
        self._items += 1
        self._outstanding += 1
        lane.has_items.set()

    async def call(self, destination: str, work: Work) -> None:
        """Run ``work`` on ``destination``'s lane, after what is queued there; return (or raise) as it does.

        On an idle lane ``work`` runs in this task at once (see the module docstring)."""
        lane = self._lane(destination)
        if lane.busy or lane.items:
            await self._queued(destination, work, None).wait()
            return
        lane.busy = True
        self._outstanding += 1
        try:
            await work()
        finally:
            lane.busy = False
            if lane.items:
                lane.has_items.set()  # queued meanwhile: the lane's task takes over
            self._finished()

    def _queued(self, destination: str, work: Work, on_done: Callable[[bool], None] | None) -> _Queued:
        """Queue ``work`` behind what ``destination``'s lane holds (never waits: it carries no chunks)."""
        queued = _Queued(on_done)
        lane = self._lane(destination)
        lane.items.append((0, functools.partial(queued.run, work)))
        self._items += 1
        self._outstanding += 1
        lane.has_items.set()
        return queued

    async def fan_out(self, sends: dict[str, Work]) -> None:
        """Run each ``sends[destination]`` on its destination's lane, all at once; raise the first
        error (a cancellation only when there is no other).

        The last destination is sent from this task (on its lane, :meth:`call`), the others by their
        lanes' tasks: no task is started for it."""
        if not sends:
            return
        *others, (last, last_work) = sends.items()
        pending = len(others)
        settled = trio.Event()

        def on_done(failed: bool) -> None:
            nonlocal pending
            pending -= 1
            if failed or not pending:
                settled.set()

        queued = [self._queued(destination, work, on_done) for destination, work in others]
        mine = await outcome.acapture(self.call, last, last_work)
        if others and not isinstance(mine, outcome.Error):
            await settled.wait()
        results = [mine, *(q.result for q in queued if q.result is not None)]
        errors = [r.error for r in results if isinstance(r, outcome.Error)]
        if errors:
            real = [error for error in errors if not isinstance(error, trio.Cancelled)]
            raise (real or errors)[0] from None

    async def reached(self, destination: str) -> None:
        """Return once ``destination``'s lane sent everything queued on it so far."""
        if destination in self._lanes:
            await self.call(destination, trio.lowlevel.checkpoint)

    async def _serve(self, lane: _Lane) -> None:
        while True:
            if not lane.items or lane.busy:
                lane.has_items = trio.Event()
                await lane.has_items.wait()
                continue
            chunks, work = lane.items.popleft()
            lane.busy = True
            try:
                await work()
            finally:
                lane.busy = False
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
        try:
            # Without a checkpoint while there is room: the drain goes on at once to its next output.
            self._results.acquire_nowait()
        except trio.WouldBlock:
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
