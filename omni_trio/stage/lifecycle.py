"""A stage's lifecycle: start its scheduler thread (warm-up), serve, stop, drain.

:class:`StageLifecycle` runs the scheduler on its own thread (:mod:`.bridge`) and the
stage's outbox drain in a trio nursery until asked to stop; then it stops the
scheduler, waits a bounded time (:data:`STOP_GRACE_S`) for its thread, and lets the
drain route everything the scheduler published before it ends. A scheduler whose
loop dies marks the stage unhealthy and fails every request the stage holds.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import trio

from omni_trio.comm.alloc import SlotAllocator, allocating
from omni_trio.config import StageConfig
from omni_trio.control.sockets import write_batch
from omni_trio.errors import StageStartupError, describe_error
from omni_trio.scheduling.outbox import Outbox
from omni_trio.scheduling.protocol import OutgoingMessage
from omni_trio.stage.abandoned import AbandonedComputes
from omni_trio.stage.bridge import OutboxSource, SchedulerThread, outbox_source
from omni_trio.stage.edges import EdgeQueues, edge_count
from omni_trio.stage.outbound import Outbound
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: The smallest drain batch whose inline messages are held and written together. Held, a small
#: batch is routed faster than its scheduler thread produces the next outputs, so the drain goes
#: back to sleep and wakes for each of them (``python -m benchmarks serving``, 4 streams: 7-14 %
#: more CPU per stream than not held, where 8 and 16 streams use 5-15 % less).
HELD_FROM = 6

#: How long a stopping stage waits for its scheduler thread, then for its drain.
STOP_GRACE_S = 5.0


class FailsHeldRequests(Protocol):
    """What the lifecycle asks of its stage when the scheduler crashed (:class:`~omni_trio.stage.stage.Stage`)."""

    @property
    def active(self) -> Collection[str]:
        """The requests the stage holds."""

    async def send_failure(self, request_id: str, error: str, *, refused: bool = False) -> None:
        """Fail ``request_id`` here: report it to the coordinator and drop its state."""


class StageLifecycle:
    """Start, serve, stop and drain one stage's scheduler (see the module docstring).

    ``stage`` is the stage whose held requests fail when the scheduler crashes;
    ``outbound`` routes what the drain takes from the scheduler's outbox;
    ``abandoned`` names the computes still running when the thread does not stop.
    """

    def __init__(
        self,
        config: StageConfig,
        scheduler: Any,
        *,
        outbound: Outbound,
        abandoned: AbandonedComputes,
        stage: FailsHeldRequests,
    ) -> None:
        self._name = config.name
        self._config = config
        self._scheduler = scheduler
        self._outbound = outbound
        self._abandoned = abandoned
        self._stage = stage
        self._thread: SchedulerThread | None = None
        self._stop_requested = trio.Event()
        self._drain_done = trio.Event()
        #: Set when :meth:`run` has returned.
        self.stopped = trio.Event()
        #: The nursery the stage's tasks run in while it serves (None before and after).
        self.nursery: trio.Nursery | None = None
        #: Why the stage cannot serve (its scheduler crashed), None while it can.
        self.unhealthy: str | None = None

    async def run(
        self, allocator: SlotAllocator | None, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start the scheduler thread (its ``ot.empty`` takes slots from ``allocator``), report ready,
        serve until :meth:`stop`, then drain."""
        self._thread = SchedulerThread(self._name, self._scheduler, allocator)
        self._thread.start()
        await self._thread.warm.wait()
        if self._thread.warm_up_error is not None:
            raise StageStartupError(
                f"stage {self._name!r}: scheduler warm-up failed: {describe_error(self._thread.warm_up_error)}"
            ) from self._thread.warm_up_error
        source = outbox_source(self._name, self._scheduler.outbox)
        source.start()
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                try:
                    await self._serve(nursery, source, allocator, task_status)
                finally:
                    # The nursery takes no new task once this body is over (an abort arriving while its
                    # tasks wind down, from another task, must not try to start one there).
                    self.nursery = None
        finally:
            if not self._drain_done.is_set():
                # Cancelled from outside (Ctrl-C, a failing sibling): still release the threads.
                self._stop_threads()
            source.close()  # also after a drain that ended: it releases the source's doorbell
            self.stopped.set()

    async def _serve(
        self,
        nursery: trio.Nursery,
        source: OutboxSource,
        allocator: SlotAllocator | None,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """The stage's tasks in ``nursery``: ready, then serving until :meth:`stop`, then shut down."""
        if edge_count(self._config) > 1:
            self._outbound.use_lanes(EdgeQueues(nursery))
        attach_loop = getattr(self._scheduler, "attach_loop", None)
        if attach_loop is not None:
            # An ``async def`` compute runs on this loop, in this nursery (scheduling/on_loop.py); its
            # tasks see the stage's pool, whose ot.empty falls back to torch.empty there (and traces why).
            with allocating(allocator):
                attach_loop(nursery)
        nursery.start_soon(self._drain, source)
        nursery.start_soon(self._watch_scheduler)
        task_status.started()
        await self._stop_requested.wait()
        await self._shutdown()
        nursery.cancel_scope.cancel()

    def stop(self) -> None:
        """Ask the stage to stop: the scheduler stops, published output is still routed."""
        self._stop_requested.set()

    def _stop_scheduler(self) -> None:
        try:
            self._scheduler.stop()
        except Exception as exc:  # noqa: BLE001 - a faulty stop must not block shutdown
            log.warning("scheduler_stop_failed", stage=self._name, error=describe_error(exc))

    def _stop_threads(self) -> None:
        """Stop the scheduler and make an outbox pump's thread exit."""
        self._stop_scheduler()
        self._scheduler.outbox.put(OutgoingMessage("", "wakeup"))

    async def _shutdown(self) -> None:
        assert self._thread is not None
        self._stop_scheduler()
        with trio.move_on_after(STOP_GRACE_S) as waited:
            await self._thread.finished.wait()
        if waited.cancelled_caught:
            log.warning(
                "scheduler_thread_still_running",
                stage=self._name,
                after_s=STOP_GRACE_S,
                computing=self._abandoned.describe_running(),
                note="left behind: it cannot be interrupted; its process exits without it",
            )
        if waited.cancelled_caught and isinstance(self._scheduler.outbox, Outbox):
            # Blocked putting a stream message behind a drain that cannot send (a consumer gone)?
            self._scheduler.outbox.stop_blocking()
        # Everything the scheduler published before stopping is still routed, then the drain ends.
        self._scheduler.outbox.put(OutgoingMessage("", "wakeup"))
        with trio.move_on_after(STOP_GRACE_S):
            await self._drain_done.wait()

    async def _watch_scheduler(self) -> None:
        assert self._thread is not None
        await self._thread.finished.wait()
        if self._thread.crash is None or self._stop_requested.is_set():
            return
        # The scheduler's loop died: nothing it holds will ever finish.
        self.unhealthy = f"scheduler crashed: {describe_error(self._thread.crash)}"
        log.error("scheduler_crashed", stage=self._name, error=self.unhealthy)
        for request_id in sorted(self._stage.active):
            await self._stage.send_failure(request_id, self.unhealthy)

    async def _route(self, batch: list[OutgoingMessage]) -> bool:
        """Route one batch from the outbox; True once the stop sentinel was reached.

        Without lanes the drain sends everything itself, so what it sends inline to each peer is
        written together after the batch (``control/sockets/write_batch.py``); with lanes, other
        tasks send. A batch of a few outputs goes out as it is routed (:data:`HELD_FROM`).
        """
        if self._outbound.has_lanes or len(batch) < HELD_FROM:
            return await self._outbound.handle_batch(batch)
        with write_batch.holding() as held:
            stop = await self._outbound.handle_batch(batch)
        await held.flush()
        return stop

    async def _drain(self, source: OutboxSource) -> None:
        try:
            while True:
                # No local keeps the batch alive while the next one is awaited: what was sent (an
                # ot.empty tensor's slot, for one) is freed as soon as it is sent.
                if await self._route(await source.next_batch()):
                    return
                source.sent()
                # Let co-located stages run between batches.
                await trio.lowlevel.checkpoint()
        finally:
            self._drain_done.set()
