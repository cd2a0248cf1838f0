"""Whose turn it is to write on a link: first come, first served, except that urgent messages go first.

A link writes one message at a time; the senders that find it busy wait their turn. With ten
thousand requests submitted at once, a FIFO turn puts an abort behind every submit queued before
it, so the abort reaches the stage after the work it was meant to stop (and its confirmation comes
back behind as many results). :class:`SendTurns` hands the link to waiting urgent senders (aborts
and their confirmations) before the others, first come first served within each kind; a message
being written is always finished first (the wire format needs it whole).
"""

from __future__ import annotations

import trio

__all__ = ["SendTurns"]


class SendTurns:
    """A lock over one link's writes with two queues of waiters: urgent ones are served first.

    The turn is handed straight to the next waiter on :meth:`release` (no barging), as
    ``trio.StrictFIFOLock`` does; a waiter cancelled while it waits leaves its queue.
    """

    def __init__(self) -> None:
        self._held = False
        self._urgent = trio.lowlevel.ParkingLot()
        self._others = trio.lowlevel.ParkingLot()

    def busy(self) -> bool:
        """Whether a sender holds the turn."""
        return self._held

    def take_nowait(self) -> None:
        """Take the turn, which must be free (:meth:`busy` is False)."""
        if self._held:
            raise RuntimeError("the link's turn is held; wait for it with take()")
        self._held = True

    async def take(self, *, urgent: bool) -> None:
        """Wait for the turn (urgent senders before the others); a checkpoint either way."""
        if not self._held:
            self._held = True
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        # release() hands the turn over before it wakes us: nothing to set here.
        await (self._urgent if urgent else self._others).park()

    def release(self) -> None:
        """Give the turn to the first urgent waiter, else the first other one, else free it."""
        if self._urgent:
            self._urgent.unpark()
        elif self._others:
            self._others.unpark()
        else:
            self._held = False
