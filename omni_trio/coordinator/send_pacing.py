"""How many new requests start sending in one pass of the caller's trio loop.

trio runs every task that is ready in one pass, and waits for I/O (and runs timers) only between
passes. Ten thousand ``submit`` calls started at once would encode and write ten thousand Submits
in one pass of a second or more; an ``abort()`` called meanwhile, and every timer that expires,
waits for the whole of it. :class:`SendPacing` lets :data:`PER_PASS` sends start in a pass and
parks the rest, oldest first; one task wakes the next :data:`PER_PASS` at each pass while any wait
(and ends when none does), so the same work is spread over short passes and an abort waits for one
of those. A request with nothing queued ahead of it starts at once; one resolved while it waits
(aborted, failed) never sends, and goes on ahead of the queue, :data:`LEAVING_PER_PASS` a pass.
"""

from __future__ import annotations

import collections
import functools
import math

import trio

__all__ = ["LEAVING_PER_PASS", "PER_PASS", "SendPacing"]

#: Sends that may start in one pass of the loop. Few: the fewer, the shorter the passes during a
#: burst (``python -m benchmarks.aborts``: p99 of ``abort()`` 0.13-0.2 s at 4, 0.35 s at 8, 0.45-0.57 s
#: at 16, 0.66-0.81 s at 64), and a pass costs little more than its tasks.
PER_PASS = 4
#: Waiters that left (their request was resolved while they waited) let go in one pass: finishing
#: a resolved request costs a fraction of sending one.
LEAVING_PER_PASS = 4 * PER_PASS
#: How often turns are refilled while nobody waits (no pass hook: a pass is shorter than this).
REFILL_S = 0.001


class SendPacing:
    """Turns to start sending a new request, :data:`PER_PASS` a pass (see the module docstring).

    Each waiter waits under a key (its request); :meth:`leave` lets one go without a turn. The
    waking task runs in ``nursery`` (the coordinator's) while any caller waits, and ends then.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._waiting: collections.OrderedDict[object, trio.lowlevel.Task] = collections.OrderedDict()
        self._leaving: collections.OrderedDict[object, trio.lowlevel.Task] = collections.OrderedDict()
        self._left = PER_PASS  # turns left in this pass (the waking task refills them)
        self._refill_at = -math.inf  # when turns are refilled while nobody waits
        self._waking = False

    async def turn(self, key: object) -> None:
        """Wait (if it must) for a turn to start sending ``key``; a checkpoint only when it waits."""
        if not self._waiting:
            # Nobody waits, so no pass is being paced: a caller that submits one request at a time
            # (each in a pass of its own) finds the turns refilled and never waits.
            now = trio.current_time()
            if now >= self._refill_at:
                self._left = PER_PASS
                self._refill_at = now + REFILL_S
            if self._left > 0:
                self._left -= 1
                return
        self._waiting[key] = trio.lowlevel.current_task()
        self._wake_soon()
        # A partial, not a closure: thousands of waiters may be parked, each object is walked by the GC.
        await trio.lowlevel.wait_task_rescheduled(functools.partial(self._cancelled, key))

    def _cancelled(self, key: object, _: object) -> trio.lowlevel.Abort:
        # A waiter cancelled in its queue (or among the leavers) goes, turn unused.
        if self._waiting.pop(key, None) is None:
            del self._leaving[key]
        return trio.lowlevel.Abort.SUCCEEDED

    def leave(self, key: object) -> None:
        """``key`` needs no turn any more (its request was resolved): its waiter goes on soon, without one.

        Not at once: the leavers of a burst of aborts would make the abort calls' own pass long.
        """
        task = self._waiting.pop(key, None)
        if task is not None:
            self._leaving[key] = task

    def _wake_soon(self) -> None:
        if not self._waking:
            self._waking = True
            self._nursery.start_soon(self._wake_while_waiting)

    async def _wake_while_waiting(self) -> None:
        # One pass at a time: this pass's turns go to the oldest waiters; the rest wait for the next.
        try:
            while self._waiting or self._leaving:
                await trio.lowlevel.cancel_shielded_checkpoint()
                for _ in range(min(LEAVING_PER_PASS, len(self._leaving))):
                    trio.lowlevel.reschedule(self._leaving.popitem(last=False)[1])
                woken = min(PER_PASS, len(self._waiting))
                for _ in range(woken):
                    trio.lowlevel.reschedule(self._waiting.popitem(last=False)[1])
                self._left = PER_PASS - woken
        finally:
            self._waking = False
