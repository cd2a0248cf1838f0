"""Receiving side: tell senders, from any thread, that a pooled slot or a held credit is free again.

A tensor viewing a sender's pooled slot may die on any thread (a scheduler thread, the garbage
collector), and a scheduler thread takes a chunk whose credit the receiver holds. Either event only
posts its message to the process's trio loop; one task there sends the queue in order. Nothing here
blocks, and nothing is sent once the loop is closing (each sender unlinks its own slots then).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

import trio

from omni_trio.comm.dataref import DataRef
from omni_trio.control.peers import Peers
from omni_trio.control.tasks import EndpointTasks
from omni_trio.control.wire import messages as m
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)


class ReleaseSender:
    """Queues slot releases and credit returns posted from any thread; one task sends them in order.

    ``peers`` send the messages, as a task of the endpoint's ``tasks`` (it raises once their
    nursery is closed); nothing is queued once they are closing.
    """

    def __init__(self, process: str, peers: Peers, tasks: EndpointTasks) -> None:
        self._process = process
        self._peers = peers
        self._tasks = tasks
        self._queue: deque[tuple[str, m.ControlMessage]] = deque()
        self._sending = False

    def post(self, token: trio.lowlevel.TrioToken, process: str, message: m.ControlMessage) -> None:
        """From any thread: have ``message`` sent to ``process`` (a no-op once the loop has ended)."""
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._queue_one, process, message)

    def _queue_one(self, process: str, message: m.ControlMessage) -> None:
        # Runs as a run_sync_soon callback, where an exception would crash the trio run.
        if self._tasks.closing:
            return
        self._queue.append((process, message))
        if not self._sending:
            try:
                self._tasks.spawn(self._send_queue)
            except Exception:  # noqa: BLE001 - the nursery is closed: nobody to tell
                self._queue.clear()
                return
            self._sending = True

    async def _send_queue(self) -> None:
        try:
            while self._queue:
                process, message = self._queue.popleft()
                try:
                    await self._peers.send(process, message)
                except Exception as exc:  # noqa: BLE001 - a lost release costs a slot, never the loop
                    log.warning("slot_release_not_sent", process=self._process, to=process, error=str(exc))
        finally:
            self._sending = False

    def clear(self) -> None:
        """Drop what is queued (closing)."""
        self._queue.clear()

    def slot_releaser(self, ref: DataRef, process: str, sender: str, receiver: str) -> Callable[[], None] | None:
        """For a pooled transfer: what tells ``sender`` (in ``process``) that no tensor views its slot any more.

        The callback runs when the last such tensor dies, on any thread; call this on the trio loop.
        """
        if ref.buffer is None or not ref.buffer.pooled:
            return None
        token = trio.lowlevel.current_trio_token()
        message = m.SlotRelease(
            from_stage=receiver, to_stage=sender, shm_name=ref.buffer.info["shm_name"], lease=ref.buffer.info["lease"]
        )

        def released() -> None:
            self.post(token, process, message)

        return released


class CreditHold:
    """Sends the :class:`~omni_trio.control.wire.messages.CreditReturn` of one object, once.

    :meth:`give_back` may run on any thread (a scheduler thread taking the chunk from its inbox):
    it only posts the message to the endpoint's loop. Build it on the trio loop.
    """

    def __init__(self, releases: ReleaseSender, process: str, message: m.CreditReturn) -> None:
        self._releases = releases
        self._token = trio.lowlevel.current_trio_token()
        self._process = process
        self._message = message
        self._done = False

    def cancel(self) -> None:
        """Nothing to give back (the read failed: the failure ACK returned the credit)."""
        self._done = True

    def give_back(self) -> None:
        """Return the sender's credit (idempotent; a no-op once the loop has ended)."""
        if self._done:
            return
        self._done = True
        self._releases.post(self._token, self._process, self._message)
