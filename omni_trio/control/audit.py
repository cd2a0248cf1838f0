"""The abort safety net: a worker names the requests its stages hold; the coordinator aborts the
ones it no longer knows.

Aborts are delivered for certain (:mod:`omni_trio.control.aborts`), but a stage can still come to
hold a request that is over: data that arrives after the stage's memory of retired ids moved on, a
branch whose result the request does not wait for (``terminal_stages_fn`` narrowed it), a message
that reached a stage behind its request's abort from another sender. So a worker that received work
reports, :data:`REPORT_INTERVAL_S` later, the requests its stages still hold
(:class:`~omni_trio.control.wire.messages.HeldReport`), and again every interval while they hold any.
The coordinator aborts, as any abort, every id in a report that is neither live nor being aborted
(:meth:`omni_trio.coordinator.coordinator.Coordinator.retire_unknown`): it was resolved, nobody waits for it.
A report lists only ids held when it was made, and the coordinator checks them when it arrives, so
a request admitted since can never be taken for a stale one.

Event-driven and rate-limited: work arriving wants a report; under load a worker reports once per
interval; a worker that holds nothing reports nothing and sleeps until work arrives again. Once its
stages hold nothing (the usual end of a request) the pending look is called off
(:meth:`HeldReporter.settle`): an idle worker does not even wake to look.
"""

from __future__ import annotations

import math
from typing import Protocol

import trio

#: The wait between work arriving at a worker and its report of what its stages hold.
REPORT_INTERVAL_S = 2.0


class HeldRequests(Protocol):
    """What the reporter looks at and whom it tells: the requests a process's stages hold."""

    def held(self) -> list[str]:
        """The requests held now."""
        ...

    async def report(self, held: list[str]) -> None:
        """Tell the coordinator that ``held`` are held."""
        ...


class HeldReporter:
    """Reports ``requests.held()`` with ``requests.report(ids)`` :data:`REPORT_INTERVAL_S` after it is
    wanted, and every interval after that while anything is held, unless :meth:`settle` called the
    look off meanwhile."""

    def __init__(self, requests: HeldRequests, interval_s: float = REPORT_INTERVAL_S) -> None:
        self._requests = requests
        self._interval_s = interval_s
        self._wanted = trio.Event()
        #: The wait for the next look, while one is under way: its deadline is when to look.
        self._pending: trio.CancelScope | None = None

    def want(self) -> None:
        """Work arrived: report what is held in a while."""
        if self._pending is not None and self._pending.deadline == math.inf:
            self._pending.deadline = trio.current_time() + self._interval_s
        self._wanted.set()

    def settle(self) -> None:
        """Nothing is held any more: no look is due until work arrives again."""
        # Moving the deadline wakes no task (cancelling the wait would wake it, on every request).
        if self._pending is not None:
            self._pending.deadline = math.inf

    async def run(self) -> None:
        """Report as it is wanted, until cancelled."""
        while True:
            await self._wanted.wait()
            with trio.CancelScope(deadline=trio.current_time() + self._interval_s) as self._pending:
                await trio.sleep_forever()  # until the deadline, which settle() and want() move
            self._pending = None
            # Reset before looking: work arriving from here on wants the next report.
            self._wanted = trio.Event()
            held = self._requests.held()
            if held:
                self._wanted.set()  # still holding: look again next interval
                await self._requests.report(held)
