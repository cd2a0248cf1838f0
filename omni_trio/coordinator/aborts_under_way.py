"""The coordinator's aborts under way: at most one per request id, each until every stage dropped it.

A failed or aborted request is dropped everywhere before its caller hears of
it (fast-fail): :meth:`AbortsUnderWay.start` starts the abort at once (the
placement delivers it, :mod:`omni_trio.control.aborts`), and
:meth:`AbortsUnderWay.settled` waits for it.
"""

from __future__ import annotations

from collections.abc import Awaitable

import trio

from omni_trio.coordinator.placement import Placement
from omni_trio.tracing.trace import get_logger

__all__ = ["AbortsUnderWay"]

log = get_logger(__name__)


class AbortsUnderWay:
    """The aborts under way, by request id.

    ``placement.abort(request_id)`` starts telling every stage to drop the request and returns
    what to await until every stage did; the wait runs in ``nursery``.
    """

    def __init__(self, placement: Placement, nursery: trio.Nursery) -> None:
        self._placement = placement
        self._nursery = nursery
        self._aborting: dict[str, trio.Event] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._aborting

    def start(self, request_id: str) -> trio.Event:
        """Start (once) the abort of ``request_id``; the event fires when every stage dropped it."""
        done = self._aborting.get(request_id)
        if done is None:
            confirmed = self._placement.abort(request_id)
            done = self._aborting[request_id] = trio.Event()
            self._nursery.start_soon(self._run, request_id, done, confirmed)
        return done

    async def settled(self, request_id: str) -> None:
        """Wait for the abort of ``request_id``, if one is under way (not shielded)."""
        pending = self._aborting.get(request_id)
        if pending is not None:
            await pending.wait()

    async def wait_all(self) -> None:
        """Wait until no abort is under way, those started meanwhile included."""
        while self._aborting:
            await next(iter(self._aborting.values())).wait()

    async def _run(self, request_id: str, done: trio.Event, confirmed: Awaitable[None]) -> None:
        try:
            # Shielded (the placement bounds its wait): an abort must reach every stage even
            # when the caller's scope, and with it this task, is being cancelled.
            with trio.CancelScope(shield=True):
                await confirmed
        except Exception as exc:  # noqa: BLE001 - a stage that kept the id is found by the safety net (control/audit.py)
            log.warning("abort_broadcast_failed", request_id=request_id, error=repr(exc))
        finally:
            del self._aborting[request_id]
            done.set()
