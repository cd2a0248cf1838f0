"""The tasks of one process's Endpoint: they run while it serves and end with it.

Every part of the endpoint that starts a task (a read, an ACK's watcher, the release queue, an abort
queue) holds the endpoint's :class:`EndpointTasks` and calls :meth:`EndpointTasks.spawn`; a part
that must not start work once the endpoint is stopping asks :attr:`EndpointTasks.closing`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio


class EndpointTasks:
    """The nursery the endpoint serves in, and whether it is stopping.

    :meth:`serve` runs the nursery, shielded from outside cancellation (while a pipeline shuts
    down its aborts and Shutdown messages still need the endpoint), until :meth:`stop`.
    """

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._serving = trio.CancelScope(shield=True)

    async def serve(self, start: Callable[[], None], task_status: trio.TaskStatus[None]) -> None:
        """Open the nursery, call ``start()`` (which spawns the first tasks), run until :meth:`stop`."""
        with self._serving:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                start()
                task_status.started()
                await trio.sleep_forever()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the endpoint (it ends with the endpoint)."""
        assert self._nursery is not None, "the endpoint is not serving"
        self._nursery.start_soon(fn, *args)

    def stop(self) -> None:
        """End :meth:`serve` (its tasks are cancelled)."""
        self._serving.cancel()

    @property
    def closing(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._serving.cancel_called
