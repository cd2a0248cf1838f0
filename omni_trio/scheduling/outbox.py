"""An outbox that wakes its stage itself.

The stage must learn, without polling, that its scheduler published a
message. With a plain ``queue.Queue`` outbox it needs a thread that blocks
on ``get()`` and forwards to trio: two thread hand-offs per message. An
:class:`Outbox` instead calls the stage back from ``put`` (on whichever
thread puts), so a message costs one hand-off from a scheduler thread and
none at all when it is put on the stage's own event-loop thread.

Every built-in scheduler uses one; a custom scheduler opts in by making its
``outbox`` an ``Outbox()``. It is a ``queue.Queue`` in every other respect.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from omni_trio.scheduling.protocol import OutgoingMessage


class Outbox(queue.Queue[OutgoingMessage]):
    """A ``queue.Queue`` of :class:`OutgoingMessage` that reports its next ``put``.

    The stage calls :meth:`take_or_arm`: it returns the queued messages, or,
    when there are none, arms a callback that the next ``put`` runs (once,
    on the putting thread, under the queue's lock: it must be quick and must
    not call the outbox). Nothing else changes: ``put``/``get`` behave as a
    ``queue.Queue``'s, ``maxsize`` included.
    """

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._on_put: Callable[[], object] | None = None

    def _put(self, item: OutgoingMessage) -> None:
        # Called by queue.Queue.put with self.mutex held.
        self.queue.append(item)
        on_put, self._on_put = self._on_put, None
        if on_put is not None:
            on_put()

    def take_or_arm(self, limit: int, on_put: Callable[[], object]) -> list[OutgoingMessage]:
        """Take up to ``limit`` messages; if there are none, arm ``on_put`` for the next put instead."""
        with self.mutex:
            count = min(limit, len(self.queue))
            if not count:
                self._on_put = on_put
                return []
            taken = [self.queue.popleft() for _ in range(count)]
            self.not_full.notify(count)
            return taken

    def disarm(self) -> None:
        """Forget an armed callback (its waiter is gone)."""
        with self.mutex:
            self._on_put = None
