"""The sending side of shared-memory transfers: each one waits for its ACK, and a credit a receiver
holds comes back with a CreditReturn.

:class:`Transfers` keeps the table of puts waiting for their
:class:`~omni_trio.control.wire.messages.DataAck` and of credits that receivers hold until their
scheduler takes the object. It never sends anything: the endpoint hands it the ACKs and credit
returns that arrive, and it fails a request through the stages it was built with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import attrs
import trio

from omni_trio.control.wire import messages as m

#: How long a sender waits for the receiver's ACK of one shared-memory transfer.
ACK_TIMEOUT_S = 30.0


class SendingStages(Protocol):
    """The stages (or the coordinator) of the process that send: what fails their requests."""

    async def fail_request(self, sender: str, request_id: str, error: str) -> None:
        """Fail ``request_id`` on behalf of ``sender``."""

    def is_retired(self, sender: str, request_id: str) -> bool:
        """Whether ``sender`` already dropped ``request_id``."""


class Relay(Protocol):
    """What settles a transfer: a shared-memory relay, or the credits of ``tcp`` transfers."""

    def settle(self, put: Any, success: bool, *, keep_credit: bool = False) -> bool:
        """Finish ``put`` as its ACK says."""

    def return_credit(self, target: str) -> None:
        """Give back a credit ``settle`` kept."""


@attrs.define(eq=False)
class PendingTransfer:
    """One put of ``relay`` waiting for its ACK."""

    relay: Relay
    put: Any
    request_id: str
    sender: str
    receiver: str
    acked: trio.Event = attrs.field(factory=trio.Event)
    error: str | None = None


@attrs.define(eq=False)
class _HeldCredit:
    """A credit of ``relay`` for ``receiver`` that an ACK said the receiver holds until its scheduler
    takes the object (a :class:`~omni_trio.control.wire.messages.CreditReturn` gives it back)."""

    relay: Relay
    request_id: str
    sender: str
    receiver: str


class Transfers:
    """Transfers waiting for their ACK, and credits held by receivers (see the module docstring).

    ``stages.fail_request(sender, request_id, error)`` fails a request whose transfer failed;
    ``stages.is_retired(sender, request_id)`` says whether ``sender`` already dropped the request
    (then a receiver's held credit comes back at once).
    """

    def __init__(self, stages: SendingStages) -> None:
        self._stages = stages
        self._pending: dict[str, PendingTransfer] = {}
        self._held: dict[str, _HeldCredit] = {}

    def track(
        self, object_id: str, relay: Relay, put: object, request_id: str, sender: str, receiver: str
    ) -> PendingTransfer:
        """Register a put before its message is sent (the ACK may arrive during the send's checkpoint)."""
        pending = self._pending[object_id] = PendingTransfer(relay, put, request_id, sender, receiver)
        return pending

    def not_sent(self, object_id: str) -> None:
        """The message of a tracked put was never sent: nobody will ACK it."""
        pending = self._pending.pop(object_id, None)
        if pending is not None:
            pending.relay.settle(pending.put, False)

    async def watch(self, object_id: str, pending: PendingTransfer) -> None:
        """Wait for the ACK of a sent put (at most :data:`ACK_TIMEOUT_S`); fail its request if it failed."""
        with trio.move_on_after(ACK_TIMEOUT_S):
            await pending.acked.wait()
        if not pending.acked.is_set():
            if self._pending.pop(object_id, None) is None:
                return  # settled by the endpoint closing
            pending.error = f"no ACK from {pending.receiver!r} within {ACK_TIMEOUT_S:g} s"
            pending.relay.settle(pending.put, False)
        if pending.error is not None:
            await self._stages.fail_request(
                pending.sender, pending.request_id, f"transfer to {pending.receiver!r} failed: {pending.error}"
            )

    def on_ack(self, message: m.DataAck) -> None:
        """Settle the put an ACK is for."""
        # Settled here, not in the watcher task: a CreditReturn right behind this ACK
        # (same socket, same receive batch) must find the held credit.
        pending = self._pending.get(message.object_id)
        if pending is None or pending.sender != message.to_stage:
            return  # already settled (timed out, or the endpoint closed)
        del self._pending[message.object_id]
        hold = message.credit_held and not self._stages.is_retired(pending.sender, pending.request_id)
        pending.relay.settle(pending.put, message.success, keep_credit=hold)
        if hold and message.success:
            self._held[message.object_id] = _HeldCredit(
                pending.relay, pending.request_id, pending.sender, pending.receiver
            )
        pending.error = message.error
        pending.acked.set()

    def on_credit_return(self, message: m.CreditReturn) -> None:
        """Give a held credit back to its relay."""
        held = self._held.get(message.object_id)
        if held is None or held.sender != message.to_stage or held.receiver != message.from_stage:
            return  # returned already (the request ended), or not ours
        del self._held[message.object_id]
        held.relay.return_credit(held.receiver)

    def return_held(self, sender: str, request_id: str) -> None:
        """``sender`` dropped ``request_id`` (abort, failure): give back the credits its receivers hold.

        A receiver returns them itself when it drops the request too; this covers
        a receiver that never will (its process died).
        """
        self._return_held_where(lambda held: held.sender == sender and held.request_id == request_id)

    def forget_receivers(self, receivers: set[str]) -> None:
        """The stages ``receivers`` are gone with their process: their puts are settled as failed now
        (no ACK will come; their requests fail with the process, so nothing more is failed here) and
        the credits they held come back."""
        for object_id, pending in list(self._pending.items()):
            if pending.receiver in receivers:
                del self._pending[object_id]
                pending.relay.settle(pending.put, False)
                pending.acked.set()
        self._return_held_where(lambda held: held.receiver in receivers)

    def _return_held_where(self, chosen: Callable[[_HeldCredit], bool]) -> None:
        for object_id, held in list(self._held.items()):
            if chosen(held):
                del self._held[object_id]
                held.relay.return_credit(held.receiver)

    def in_use(self, sender: str) -> int:
        """Transfers sent by ``sender`` that wait for their ACK."""
        return sum(1 for p in self._pending.values() if p.sender == sender)

    def close(self) -> None:
        """Settle every put as failed and forget held credits (the relays are closing)."""
        for pending in self._pending.values():
            pending.relay.settle(pending.put, False)
        self._pending.clear()
        self._held.clear()
