"""An inbox that tells the stage when its scheduler took a message.

A stage in another process than its stream producer receives each chunk
that travelled through shared memory while holding one of the sender's
credits (``comm.credits`` per sender and target). If the credit went back as
soon as the chunk was read, a consumer slower than the transport would
collect the rest of the stream in its inbox. With an :class:`Inbox` the
credit goes back when the scheduler *takes* the chunk (``get``), or when the
stage drops it unread (an abort purges it), so the chunks a consumer has yet
to process are bounded by the sender's credits.

Every built-in scheduler uses one; a custom scheduler opts in by making its
``inbox`` an ``Inbox()``. It is a ``queue.Queue`` in every other respect.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from omni_trio.scheduling.protocol import IncomingMessage


class Inbox(queue.Queue[IncomingMessage]):
    """A ``queue.Queue`` of :class:`IncomingMessage` that can report when a message leaves it.

    :meth:`put_tracked` queues a message with a callback that runs once, when
    the message is taken (``get``/``get_nowait``, on the taking thread, under
    the queue's lock: it must be quick and must not call the inbox) or when
    :meth:`purge` drops it (on the purging thread).
    """

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        # id(message) -> callbacks, oldest first; a message is alive while queued, so ids are unique.
        self._on_taken: dict[int, list[Callable[[], object]]] = {}

    @property
    def tracked(self) -> int:
        """Queued messages that carry a callback."""
        with self.mutex:
            return sum(len(callbacks) for callbacks in self._on_taken.values())

    def put_tracked(self, item: IncomingMessage, on_taken: Callable[[], object]) -> None:
        """Queue ``item`` (never waits, whatever ``maxsize``) and run ``on_taken`` once it leaves the inbox."""
        self.put_all([item], on_taken)

    def put_all(self, items: list[IncomingMessage], on_taken: Callable[[], object] | None = None) -> None:
        """Queue ``items`` in order in one go (never waits, whatever ``maxsize``): a run of chunks wakes
        the scheduler once, not once per chunk. ``on_taken`` (if given) runs once the last one leaves."""
        if not items:
            return
        with self.mutex:
            if on_taken is not None:
                self._on_taken.setdefault(id(items[-1]), []).append(on_taken)
            self.queue.extend(items)
            self.unfinished_tasks += len(items)
            self.not_empty.notify()

    def _get(self) -> IncomingMessage:
        # Called by queue.Queue.get with self.mutex held.
        item = self.queue.popleft()
        if self._on_taken:
            self._taken(item)
        return item

    def _taken(self, item: IncomingMessage) -> None:
        callbacks = self._on_taken.get(id(item))
        if callbacks is None:
            return
        callback = callbacks.pop(0)
        if not callbacks:
            del self._on_taken[id(item)]
        callback()

    def purge(self, *request_ids: str) -> int:
        """Drop the queued messages of ``request_ids``, running their callbacks; returns how many.

        One sweep of the queue whatever the number of ids (an abort storm purges in batches).
        """
        dropped = set(request_ids)
        with self.mutex:
            kept: list[IncomingMessage] = []
            removed: list[IncomingMessage] = []
            for item in self.queue:
                (removed if item.request_id in dropped else kept).append(item)
            if removed:
                self.queue.clear()
                self.queue.extend(kept)
                self.unfinished_tasks = max(self.unfinished_tasks - len(removed), 0)
                if not self.unfinished_tasks:
                    self.all_tasks_done.notify_all()
                self.not_full.notify_all()
                for item in removed:
                    self._taken(item)
            return len(removed)
