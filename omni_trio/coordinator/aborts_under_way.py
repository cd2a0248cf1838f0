"""The coordinator's aborts under way: at most one per request id, each until every stage dropped it.

A failed or aborted request is dropped everywhere before its caller hears of
it (fast-fail): :meth:`AbortsUnderWay.start` starts the abort at once (the
placement delivers it, :mod:`omni_trio.control.aborts`), and
:meth:`AbortsUnderWay.settled` waits for it.

No task runs per abort: the placement's event says when it is done, and the
events already set are forgotten as new aborts start. A storm of ten thousand
aborts is then ten thousand dictionary entries, not ten thousand tasks the
caller's loop must step through while the aborts wait their turn.
"""

from __future__ import annotations

import trio

from omni_trio.coordinator.placement import Placement

__all__ = ["AbortsUnderWay"]


class AbortsUnderWay:
    """The aborts under way, by request id.

    ``placement.abort(request_id)`` starts telling every stage to drop the request and returns
    an event that fires once every stage did (the placement bounds how long it waits for a
    process that does not answer).
    """

    def __init__(self, placement: Placement) -> None:
        self._placement = placement
        self._aborting: dict[str, trio.Event] = {}
        #: How many entries the next sweep of finished aborts waits for (amortised: twice the
        #: entries the last sweep left, so each abort is swept a bounded number of times).
        self._sweep_at = 64

    def __contains__(self, request_id: object) -> bool:
        done = self._aborting.get(request_id)  # type: ignore[call-overload]
        return done is not None and not done.is_set()

    def start(self, request_id: str) -> trio.Event:
        """Start (once) the abort of ``request_id``; the event fires when every stage dropped it."""
        done = self._aborting.get(request_id)
        if done is None or done.is_set():
            done = self._aborting[request_id] = self._placement.abort(request_id)
            if len(self._aborting) >= self._sweep_at:
                self._sweep()
        return done

    async def settled(self, request_id: str) -> None:
        """Wait for the abort of ``request_id``, if one is under way (not shielded)."""
        pending = self._aborting.get(request_id)
        if pending is not None:
            await pending.wait()

    async def wait_all(self) -> None:
        """Wait until no abort is under way, those started meanwhile included."""
        while True:
            self._sweep()
            if not self._aborting:
                return
            await next(iter(self._aborting.values())).wait()

    def _sweep(self) -> None:
        self._aborting = {rid: done for rid, done in self._aborting.items() if not done.is_set()}
        self._sweep_at = max(64, 2 * len(self._aborting))
