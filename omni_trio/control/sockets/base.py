"""The interface of the control plane's sockets: what :class:`~omni_trio.control.peers.Peers` needs.

Modelled on httpcore's ``_backends`` (a backend makes streams; the streams carry bytes): a
:class:`SocketBackend` makes one process's sockets, an :class:`Inbox` receives whole messages, a
:class:`Link` sends them to one peer. The real backend is
:class:`~omni_trio.control.sockets.host.HostSockets` (a Unix stream link between processes of one
host, ZMQ over ``tcp://`` between hosts); :class:`~omni_trio.control.sockets.memory.MemorySockets`
is the in-memory one the control plane's unit tests run on.

What every backend guarantees at this interface (the control plane relies on it):

- A link's messages reach the inbox whole and in the order they were sent; messages of two links to
  one inbox interleave in any order.
- Every message is sealed with the run's proof when sent and checked when received (a message
  without it is counted by the policy's authenticator and never returned); a message bigger than the
  policy's ``max_message_bytes`` raises :class:`~omni_trio.errors.MessageTooLarge` at the sender.
- A full link makes its senders wait (never drops); a closed socket raises
  ``trio.ClosedResourceError`` in pending and later calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire.auth import Frame


class Inbox(Protocol):
    """Where a process receives messages (one owning task receives)."""

    @property
    def source(self) -> str:
        """Its address (a path, or the ``tcp://`` address it is bound at), for reports."""
        ...

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        ...

    async def recv_multipart(self) -> list[bytes]:
        """One message (its frames, the proof checked and removed); raises trio.ClosedResourceError once closed."""
        ...

    def recv_nowait(self) -> list[bytes] | None:
        """One message already here, or None (never waits)."""
        ...

    def close(self) -> None:
        """Close it (idempotent)."""
        ...


class Link(Protocol):
    """Sends messages to one peer's inbox (any number of tasks may send)."""

    async def send_multipart(self, frames: Sequence[Frame], *, urgent: bool = False) -> None:
        """Send one message, whole, or nothing (cancel-safe); waits while the link is full. An
        ``urgent`` message goes before the messages other tasks are waiting to send."""
        ...

    def close(self) -> None:
        """Close it (idempotent)."""
        ...


class SocketBackend(Protocol):
    """Makes the sockets of one process, each with the run's :attr:`policy`.

    A peer on this host is named by its process (its inbox is at a place the backend knows); a peer
    on another host by its ``tcp://`` address.
    """

    @property
    def policy(self) -> SocketPolicy:
        """The run's proof and size cap, applied by every socket made here."""
        ...

    def bind_local(self, process: str) -> Inbox:
        """The inbox of ``process`` (this process) on this host, bound now."""
        ...

    def connect_local(self, process: str) -> Link:
        """A link to the inbox of ``process`` on this host (it may bind later, or again after a restart)."""
        ...

    def bind_tcp(self, address: str) -> Inbox:
        """An inbox bound at the ``tcp://`` ``address`` (``tcp://HOST:*``: any free port; see its source)."""
        ...

    def connect_tcp(self, address: str) -> Link:
        """A link to the inbox bound at the ``tcp://`` ``address``."""
        ...

    @property
    def refused_streams(self) -> int:
        """Connections this process's inboxes dropped for breaking the link's wire format."""
        ...

    @property
    def refused_connections(self) -> int:
        """Connections this process's inboxes closed for their limits
        (:class:`~omni_trio.control.sockets.limits.InboxLimits`)."""
        ...

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's inbox (a dead worker)."""
        ...

    def begin_closing(self) -> None:
        """The process is shutting down: a peer that is gone already is expected now, so its links
        drop what they cannot deliver quietly (still counted in :attr:`undeliverable`)."""
        ...

    def close(self) -> None:
        """Release what the backend itself holds (each socket is closed by its owner first)."""
        ...
