"""Messages one task sends while it routes a batch, written to each peer together at the end.

A stage's drain takes up to 64 outputs from its scheduler at once (at 16 concurrent streams a
vocoder's drain takes 16 chunks, one per stream, after each talker step) and sends each as a
message of its own. Written one by one, every message costs a ``sendmsg``, a pass of the trio loop
and, at the receiver, a wake-up and a read. Inside :func:`holding`, a same-host link
(:class:`~omni_trio.control.sockets.unix_link.UnixPush`) keeps the messages of the task that opened
the batch and :meth:`WriteBatch.flush` writes each peer's in one ``sendmsg`` (``python -m benchmarks
serving``: 5-15 % less CPU per stream at 8 and 16 streams; the stage holds batches of six outputs
or more, see ``stage/lifecycle.py``). Each message is still framed and sealed on its own; the
receiver reads them as before.

Only messages sent under :func:`holdable` wait: the data plane's messages whose object travelled
inline (:class:`~omni_trio.control.sending.Sender`). Nothing then waits for them: a message about an
object in shared memory or on a TCP connection may be what a credit or a pooled slot the same drain
waits for next depends on, so it goes out at once, with what was held for its peer before it (the
order of one task's messages to one peer is kept). Only the opening task's messages wait, and only
until the batch is flushed: a task the batch's code starts, or any other, writes at once. Urgent
messages are never held, nor a message whose frames are not ``bytes`` (a view of memory its sender
may reuse once the send returned).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator

import trio

__all__ = ["WriteBatch", "current", "holdable", "holding", "may_hold"]

#: Writes one link's held messages (its buffers, in order); the link's own method.
WriteHeld = Callable[[list[memoryview]], Awaitable[None]]

_CURRENT: contextvars.ContextVar[WriteBatch | None] = contextvars.ContextVar("omni_trio_write_batch", default=None)
_HOLDABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("omni_trio_write_holdable", default=False)


class WriteBatch:
    """The messages held for each peer, in order, until :meth:`flush` (see the module docstring)."""

    def __init__(self) -> None:
        self._owner = trio.lowlevel.current_task()
        self._open = True
        self._held: dict[object, tuple[WriteHeld, list[memoryview]]] = {}

    def mine(self) -> bool:
        """Whether the running task opened the batch and it is not flushed yet (only then is anything held)."""
        return self._open and trio.lowlevel.current_task() is self._owner

    def hold(self, link: object, write: WriteHeld, buffers: list[memoryview]) -> None:
        """Keep ``buffers`` (one framed message) for ``link``, after what is held for it already."""
        self._held.setdefault(link, (write, []))[1].extend(buffers)

    def take(self, link: object) -> list[memoryview]:
        """What is held for ``link`` (removed from the batch): written before a message that cannot wait."""
        held = self._held.pop(link, None)
        return [] if held is None else held[1]

    async def flush(self) -> None:
        """Write what is held, each peer's in one go; nothing is held after this."""
        self._open = False
        held, self._held = self._held, {}
        for write, buffers in held.values():
            await write(buffers)


def current() -> WriteBatch | None:
    """The batch the running task's messages go into, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def holding() -> Iterator[WriteBatch]:
    """Hold the messages this task sends within the block; the caller flushes the batch after it."""
    batch = WriteBatch()
    token = _CURRENT.set(batch)
    try:
        yield batch
    finally:
        _CURRENT.reset(token)


def may_hold() -> bool:
    """Whether the message being sent was marked :func:`holdable`."""
    return _HOLDABLE.get()


@contextlib.contextmanager
def holdable() -> Iterator[None]:
    """The message sent within the block may wait in the running task's batch (nothing waits for it)."""
    token = _HOLDABLE.set(True)
    try:
        yield
    finally:
        _HOLDABLE.reset(token)
