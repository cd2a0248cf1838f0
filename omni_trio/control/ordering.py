"""Delivery order: the messages of one flow (request, sender, receiver) reach their stage in arrival
order, while their reads overlap.

Objects are read as soon as their message arrives (a shared-memory read may take a while and runs in
a task of its own), but they are delivered to their stage in arrival order per flow, so a chunk read
from shared memory is never overtaken by the done signal or the inline payload that followed it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

#: One flow: (request id, sender address, receiver address).
Flow = tuple[str, str, str]


class DeliveryOrder:
    """Delivers the messages of each flow in arrival order, while their reads overlap."""

    def __init__(self) -> None:
        self._tails: dict[Flow, trio.Event] = {}

    def idle(self, flow: Flow) -> bool:
        """True when nothing of ``flow`` is still being read or delivered."""
        return flow not in self._tails

    def claim(self, flow: Flow) -> tuple[trio.Event | None, trio.Event]:
        """Take the next place in ``flow``, in arrival order: call it before any checkpoint."""
        previous = self._tails.get(flow)
        mine = self._tails[flow] = trio.Event()
        return previous, mine

    async def run(
        self,
        flow: Flow,
        place: tuple[trio.Event | None, trio.Event],
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
    ) -> None:
        """``read()`` now, then ``deliver(value)`` once earlier messages of the flow were delivered."""
        previous, mine = place
        try:
            value = await read()
            if previous is not None:
                await previous.wait()
            await deliver(value)
        finally:
            mine.set()
            if self._tails.get(flow) is mine:
                del self._tails[flow]

    def __len__(self) -> int:
        return len(self._tails)
