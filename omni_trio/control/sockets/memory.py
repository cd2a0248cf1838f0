"""The in-memory socket backend: every process of a test in one ``trio.run``, no socket, no process.

For the control plane's unit tests (credits, ACKs, in-order delivery, abort delivery and resending,
on ``trio.testing.MockClock``), as httpcore's mock backend is for its connection pool. It keeps the
interface's promises (:mod:`omni_trio.control.sockets.base`) the way the real backend keeps them:

- a link's messages reach the inbox whole and in order; links to one inbox interleave;
- every message is sealed with the run's proof and checked by the receiving inbox (a message without
  it is counted by the receiver's authenticator and skipped); a message over ``max_message_bytes``
  raises :class:`~omni_trio.errors.MessageTooLarge` at the sender, nothing sent;
- a full inbox (``capacity`` messages) makes its senders wait, never drops;
- as over the Unix link, a message for an inbox nobody has bound (a peer that went away,
  :meth:`MemoryNetwork.kill`) is dropped and counted (:attr:`MemorySockets.undeliverable`); a
  later bind at the address (a restart) receives what is sent from then on.

And it lets a test do what the real sockets never do on their own, and see what went where:
:meth:`MemoryNetwork.drop` (a message lost, e.g. an ACK), :meth:`MemoryNetwork.duplicate`,
:meth:`MemoryNetwork.hold` and :meth:`MemoryNetwork.release` (a connection's messages held back, so
that another connection's overtake them), :meth:`MemoryNetwork.kill` (a peer gone, mid-transfer
if a test likes), and :attr:`MemoryNetwork.log` (every message a link sent, with the clock's time).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence

import attrs
import trio

from omni_trio.control.sockets.turns import SendTurns
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import Frame
from omni_trio.control.wire.codec import decode
from omni_trio.errors import MessageTooLarge

__all__ = ["MemoryInbox", "MemoryLink", "MemoryNetwork", "MemorySockets", "Sent"]

#: Messages an inbox holds before its senders wait (a socket buffer's worth).
DEFAULT_CAPACITY = 64


def local_address(process: str) -> str:
    """The address of ``process``'s inbox on its host, in a :class:`MemoryNetwork`."""
    return f"local:{process}"


def _as_bytes(frame: Frame) -> bytes:
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)  # a zmq.Frame has .bytes


@attrs.frozen
class Sent:
    """One message a link sent, as the network saw it: when, from and to which process, and what
    became of it (``delivered``, ``dropped`` by a fault, ``undeliverable``: nobody bound there)."""

    time: float
    sender: str
    receiver: str
    message: m.ControlMessage
    fate: str


@attrs.define(eq=False)
class _Rule:
    """A fault on the connection ``sender -> receiver`` for the next ``count`` messages of ``kind``."""

    sender: str
    receiver: str
    kind: type[m.ControlMessage]
    action: str
    count: int
    where: Callable[[m.ControlMessage], bool] | None

    def matches(self, sender: str, receiver: str, message: m.ControlMessage) -> bool:
        return (
            self.count > 0
            and (self.sender, self.receiver) == (sender, receiver)
            and isinstance(message, self.kind)
            and (self.where is None or self.where(message))
        )


class MemoryInbox:
    """An inbox bound in a :class:`MemoryNetwork` (see the module docstring); one owning task receives."""

    def __init__(self, network: MemoryNetwork, address: str, owner: str, policy: SocketPolicy, capacity: int) -> None:
        self._network = network
        self._address = address
        self.owner = owner
        self._auth = policy.auth
        self._capacity = capacity
        self._messages: deque[list[bytes]] = deque()
        self._readers = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self._closed = False

    @property
    def source(self) -> str:
        """The address it is bound at."""
        return self._address

    @property
    def closed(self) -> bool:
        """Whether it was closed (by its owner, or by :meth:`MemoryNetwork.kill`)."""
        return self._closed

    @property
    def full(self) -> bool:
        """Whether a sender must wait for room."""
        return len(self._messages) >= self._capacity

    def put(self, frames: list[bytes]) -> None:
        """A link hands over one sealed message (the link made sure there is room)."""
        self._messages.append(frames)
        self._readers.unpark_all()

    async def wait_for_room(self) -> None:
        """Until the owner took a message (or the inbox closed)."""
        await self._room.park()

    async def recv_multipart(self) -> list[bytes]:
        """One message (the proof checked and removed); cancel-safe; raises trio.ClosedResourceError
        once closed."""
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self.recv_nowait()
        if message is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        while True:
            await self._readers.park()
            message = self.recv_nowait()
            if message is not None:
                return message

    def recv_nowait(self) -> list[bytes] | None:
        """One message already here, else None."""
        if self._closed:
            raise trio.ClosedResourceError("the inbox was closed")
        while self._messages:
            frames = self._messages.popleft()
            self._room.unpark()
            opened = self._auth.open(frames, self._address)
            if opened is not None:
                return opened
        return None

    def close(self) -> None:
        """Close it: pending and later receives raise ClosedResourceError; senders waiting for room
        find nobody listening. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._messages.clear()
        self._network.unbind(self)
        self._readers.unpark_all()
        self._room.unpark_all()


class MemoryLink:
    """Sends from process ``owner`` to the inbox bound at ``address`` (whoever binds it, then or later)."""

    def __init__(self, network: MemoryNetwork, owner: str, address: str, policy: SocketPolicy) -> None:
        self._network = network
        self._owner = owner
        self._address = address
        self._auth = policy.auth
        self._max_bytes = policy.max_message_bytes
        self._turns = SendTurns()
        self._held: list[list[bytes]] = []
        self._closed = False
        #: Messages dropped because nobody was bound at the address.
        self.undeliverable = 0

    @property
    def owner(self) -> str:
        """The process that sends on it."""
        return self._owner

    @property
    def address(self) -> str:
        """Where it sends."""
        return self._address

    async def send_multipart(self, frames: Sequence[Frame], *, urgent: bool = False) -> None:
        """Send one message, whole (or nothing: cancel-safe); waits while the inbox is full; an
        ``urgent`` one goes before those other tasks wait to send."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._closed:
            raise trio.ClosedResourceError("the link was closed")
        sealed = [_as_bytes(frame) for frame in self._auth.seal(frames)]
        size = sum(len(frame) for frame in sealed)
        if size > self._max_bytes:
            raise MessageTooLarge(size, self._max_bytes)
        copies = self._network.admit(self, decode(frames))
        await self._turns.take(urgent=urgent)
        try:
            if self._network.holds(self):
                self._held.extend([sealed] * copies)
            for _ in range(copies):
                await self._deliver(sealed)
        finally:
            self._turns.release()

    async def flush_held(self) -> None:
        """Deliver what a :meth:`MemoryNetwork.hold` kept back, in order."""
        await self._turns.take(urgent=False)
        try:
            held, self._held = self._held, []
            for sealed in held:
                await self._deliver(sealed)
        finally:
            self._turns.release()

    async def _deliver(self, sealed: list[bytes]) -> None:
        if self._network.holds(self):
            return
        while True:
            inbox = self._network.inbox_at(self._address)
            if inbox is None:
                self.undeliverable += 1
                return
            if not inbox.full:
                inbox.put(sealed)
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            await inbox.wait_for_room()

    def close(self) -> None:
        """Close it (what it holds back is dropped). Idempotent."""
        self._closed = True
        self._held.clear()


class MemorySockets:
    """The :class:`~omni_trio.control.sockets.base.SocketBackend` of ``process`` in a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, process: str, policy: SocketPolicy) -> None:
        self._network = network
        self._process = process
        self._policy = policy
        self._links: list[MemoryLink] = []

    @property
    def policy(self) -> SocketPolicy:
        """The run's proof and size cap, applied by every socket made here."""
        return self._policy

    def bind_local(self, process: str) -> MemoryInbox:
        """The inbox of ``process`` on its host, bound now."""
        return self._network.bind(local_address(process), self._process, self._policy)

    def connect_local(self, process: str) -> MemoryLink:
        """A link to the inbox of ``process`` on this host."""
        return self._link(local_address(process))

    def bind_tcp(self, address: str) -> MemoryInbox:
        """An inbox at the ``tcp://`` ``address`` (a port ``*`` is given a free one)."""
        return self._network.bind(self._network.free_port(address), self._process, self._policy)

    def connect_tcp(self, address: str) -> MemoryLink:
        """A link to the inbox at the ``tcp://`` ``address``."""
        return self._link(address)

    def _link(self, address: str) -> MemoryLink:
        link = MemoryLink(self._network, self._process, address, self._policy)
        self._links.append(link)
        return link

    @property
    def refused_streams(self) -> int:
        """Always 0: an in-memory link has no stream format to break."""
        return 0

    @property
    def refused_connections(self) -> int:
        """Always 0: nobody outside a test connects to an in-memory inbox."""
        return 0

    @property
    def undeliverable(self) -> int:
        """Messages its links dropped because nobody was bound where they sent."""
        return sum(link.undeliverable for link in self._links)

    def begin_closing(self) -> None:
        """Nothing to quieten: the memory backend logs no drops (see :attr:`MemoryNetwork.log`)."""

    def close(self) -> None:
        """Nothing to release: every socket is closed by its owner."""


class MemoryNetwork:
    """The inboxes of every process of one test by address, and the faults the test injects."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._inboxes: dict[str, MemoryInbox] = {}
        self._owners: dict[str, str] = {}
        self._ports = itertools.count(40000)
        self._rules: list[_Rule] = []
        self._holding: set[tuple[str, str]] = set()
        self._held_links: list[MemoryLink] = []
        #: Every message a link sent, in order (see :class:`Sent`).
        self.log: list[Sent] = []

    def sockets(self, process: str, policy: SocketPolicy) -> MemorySockets:
        """The socket backend of ``process``."""
        return MemorySockets(self, process, policy)

    # ------------------------------------------------------------------ what the sockets call

    def bind(self, address: str, owner: str, policy: SocketPolicy) -> MemoryInbox:
        """Bind an inbox of ``owner`` at ``address`` (replacing a dead one there, as a restart does)."""
        old = self._inboxes.get(address)
        if old is not None and not old.closed:
            raise OSError(f"{address} is bound already")
        inbox = self._inboxes[address] = MemoryInbox(self, address, owner, policy, self._capacity)
        self._owners[address] = owner
        return inbox

    def unbind(self, inbox: MemoryInbox) -> None:
        """``inbox`` closed: nobody receives at its address until it is bound again."""
        if self._inboxes.get(inbox.source) is inbox:
            del self._inboxes[inbox.source]

    def free_port(self, address: str) -> str:
        """``address`` with a port ``*`` replaced by a free one."""
        return f"{address[:-1]}{next(self._ports)}" if address.endswith(":*") else address

    def inbox_at(self, address: str) -> MemoryInbox | None:
        """The inbox bound at ``address`` now, if any."""
        return self._inboxes.get(address)

    def _receiver(self, link: MemoryLink) -> str:
        return self._owners.get(link.address, link.address)

    def admit(self, link: MemoryLink, message: m.ControlMessage) -> int:
        """Log ``message`` and apply the faults: how many copies of it to deliver (0: lost)."""
        receiver = self._receiver(link)
        copies = 1
        for rule in self._rules:
            if rule.matches(link.owner, receiver, message):
                rule.count -= 1
                copies = 0 if rule.action == "drop" else 2
                break
        fate = "dropped" if copies == 0 else "delivered" if link.address in self._inboxes else "undeliverable"
        self.log.append(Sent(trio.current_time(), link.owner, receiver, message, fate))
        if (link.owner, receiver) in self._holding and link not in self._held_links:
            self._held_links.append(link)
        return copies

    def holds(self, link: MemoryLink) -> bool:
        """Whether the link's connection is held back now."""
        return (link.owner, self._receiver(link)) in self._holding

    # ------------------------------------------------------------------ faults

    def drop(
        self,
        sender: str,
        receiver: str,
        kind: type[m.ControlMessage],
        *,
        count: int = 1,
        where: Callable[[m.ControlMessage], bool] | None = None,
    ) -> None:
        """Lose the next ``count`` messages of ``kind`` (``where`` says so) from ``sender`` to ``receiver``."""
        self._rules.append(_Rule(sender, receiver, kind, "drop", count, where))

    def duplicate(
        self,
        sender: str,
        receiver: str,
        kind: type[m.ControlMessage],
        *,
        count: int = 1,
        where: Callable[[m.ControlMessage], bool] | None = None,
    ) -> None:
        """Deliver the next ``count`` messages of ``kind`` from ``sender`` to ``receiver`` twice each."""
        self._rules.append(_Rule(sender, receiver, kind, "duplicate", count, where))

    def hold(self, sender: str, receiver: str) -> None:
        """Keep back what ``sender`` sends to ``receiver`` (in order) until :meth:`release`: other
        connections to ``receiver`` overtake it."""
        self._holding.add((sender, receiver))

    async def release(self, sender: str, receiver: str) -> None:
        """Deliver what :meth:`hold` kept back, in the order it was sent, and stop holding."""
        self._holding.discard((sender, receiver))
        for link in list(self._held_links):
            if (link.owner, self._receiver(link)) == (sender, receiver):
                self._held_links.remove(link)
                await link.flush_held()

    def kill(self, process: str) -> None:
        """``process`` is gone: its inboxes close (its receive loops end), and what is sent to them
        from now on is undeliverable."""
        for inbox in [inbox for inbox in self._inboxes.values() if inbox.owner == process]:
            inbox.close()

    def sent(self, kind: type[m.ControlMessage], sender: str | None = None, receiver: str | None = None) -> list[Sent]:
        """What :attr:`log` holds of ``kind`` (from ``sender``, to ``receiver``, where given)."""
        return [
            entry
            for entry in self.log
            if isinstance(entry.message, kind)
            and sender in (None, entry.sender)
            and receiver in (None, entry.receiver)
        ]
