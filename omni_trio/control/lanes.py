"""Lanes: in-order delivery of the messages of one (request, sender, receiver), with overlapping reads.

Objects are read as soon as their message arrives (a shared-memory read may take a while and runs in
a task of its own), but they are delivered to their stage in arrival order per lane, so a chunk read
from shared memory is never overtaken by the done signal or the inline payload that followed it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio


class Lanes:
    """Delivers the messages of one (request, sender, receiver) lane in arrival order,
    while their reads overlap."""

    def __init__(self) -> None:
        self._tails: dict[tuple[str, str, str], trio.Event] = {}

    def idle(self, lane: tuple[str, str, str]) -> bool:
        """True when nothing of ``lane`` is still being read or delivered."""
        return lane not in self._tails

    def claim(self, lane: tuple[str, str, str]) -> tuple[trio.Event | None, trio.Event]:
        """Take the next place in ``lane``, in arrival order: call it before any checkpoint."""
        previous = self._tails.get(lane)
        mine = self._tails[lane] = trio.Event()
        return previous, mine

    async def run(
        self,
        lane: tuple[str, str, str],
        place: tuple[trio.Event | None, trio.Event],
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
    ) -> None:
        """``read()`` now, then ``deliver(value)`` once earlier messages of the lane were delivered."""
        previous, mine = place
        try:
            value = await read()
            if previous is not None:
                await previous.wait()
            await deliver(value)
        finally:
            mine.set()
            if self._tails.get(lane) is mine:
                del self._tails[lane]

    def __len__(self) -> int:
        return len(self._tails)
