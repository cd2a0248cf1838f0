"""The abort safety net: stages forget requests the coordinator no longer knows.

Aborts are delivered for certain (:mod:`omni_trio.control.aborts`), but a stage can still come to
hold a request that is over: data that arrives after the stage's memory of retired ids moved on, a
branch whose result the request does not wait for (``terminal_stages_fn`` narrowed it), a stage that
got a request behind its abort. So, a while after requests were resolved, the coordinator asks every
worker which requests its stages hold (:class:`~omni_trio.control.messages.HeldQuery`); each answers
with a :class:`~omni_trio.control.messages.HeldReport`, and every id in it that the coordinator no
longer knows is aborted everywhere, as any abort is.

Event-driven and rate-limited: a round runs :data:`AUDIT_INTERVAL_S` after the first resolution (or
non-empty report) since the last round, so under load there is one round per interval, and an idle
pipeline, once a round found nothing held, runs none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

#: The wait between a resolution and the round that checks for requests stages still hold.
AUDIT_INTERVAL_S = 2.0


class HeldAudit:
    """Runs ``query()`` (ask every worker what it holds) :data:`AUDIT_INTERVAL_S` after it is wanted."""

    def __init__(self, query: Callable[[], Awaitable[None]], interval_s: float = AUDIT_INTERVAL_S) -> None:
        self._query = query
        self._interval_s = interval_s
        self._wanted = trio.Event()

    def want(self) -> None:
        """A request was resolved (or a stage still holds some): check again in a while."""
        self._wanted.set()

    async def run(self) -> None:
        """Serve rounds as they are wanted, until cancelled."""
        while True:
            await self._wanted.wait()
            await trio.sleep(self._interval_s)
            # Reset before the round: what is resolved while it runs wants the next one.
            self._wanted = trio.Event()
            await self._query()
