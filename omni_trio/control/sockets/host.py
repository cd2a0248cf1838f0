"""The real socket backend: a Unix stream link between processes of one host, ZMQ over ``tcp://`` between hosts.

A process's inbox on this host is ``<process>.sock`` in the run's IPC directory
(:class:`~omni_trio.control.sockets.unix_inbox.UnixPull`; a peer here reaches it through a
:class:`~omni_trio.control.sockets.unix_link.UnixPush`); between hosts, ZMQ PULL and PUSH sockets
with CURVE (:mod:`omni_trio.control.sockets.zmq_sockets`). See
:mod:`omni_trio.control.sockets.base` for the interface.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from omni_trio.control.sockets.unix_inbox import UnixPull
from omni_trio.control.sockets.unix_link import UnixPush
from omni_trio.control.sockets.zmq_sockets import bind_pull, connect_push
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket


def socket_path(ipc_dir: Path, process: str) -> Path:
    """Where ``process`` receives its control messages on this host."""
    return ipc_dir / f"{process}.sock"


class HostSockets:
    """The sockets of one process in the run's ``ipc_dir``, with the run's ``policy``.

    A worker that joined over TCP passes the ZMQ ``context`` its join socket was made in.
    """

    def __init__(self, ipc_dir: Path, policy: SocketPolicy, context: zmq.Context[Any] | None = None) -> None:
        self._ipc_dir = ipc_dir
        self._policy = policy
        self._context: zmq.Context[Any] = zmq.Context() if context is None else context
        self._inboxes: list[UnixPull] = []
        self._links: list[UnixPush] = []
        self._closing = False

    @property
    def policy(self) -> SocketPolicy:
        """The run's proof and size cap, applied by every socket made here."""
        return self._policy

    @property
    def context(self) -> zmq.Context[Any]:
        """The ZMQ context of the ``tcp://`` sockets (for sockets another component opens beside them)."""
        return self._context

    def bind_local(self, process: str) -> UnixPull:
        """The inbox of ``process`` (this process) in the IPC directory, bound now."""
        inbox = UnixPull(socket_path(self._ipc_dir, process), self._policy)
        self._inboxes.append(inbox)
        return inbox

    def connect_local(self, process: str) -> UnixPush:
        """A link to the inbox of ``process`` in the IPC directory (connects at its first send)."""
        link = UnixPush(socket_path(self._ipc_dir, process), self._policy)
        if self._closing:
            link.begin_closing()  # opened while the process shuts down: its drops are expected too
        self._links.append(link)
        return link

    def bind_tcp(self, address: str) -> TrioSocket:
        """A ZMQ PULL socket bound at the ``tcp://`` ``address`` (CURVE)."""
        return bind_pull(self._context, address, self._policy)

    def connect_tcp(self, address: str) -> TrioSocket:
        """A ZMQ PUSH socket connected to the ``tcp://`` ``address`` (CURVE)."""
        return connect_push(self._context, address, self._policy)

    @property
    def refused_streams(self) -> int:
        """Connections the inboxes dropped for breaking the Unix link's wire format."""
        return sum(inbox.refused_streams for inbox in self._inboxes)

    @property
    def refused_connections(self) -> int:
        """Connections the inboxes closed for their limits (unproven too long or too many, a message
        unfinished too long or too big together, no descriptor free)."""
        return sum(inbox.refused_connections for inbox in self._inboxes)

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's path (a dead worker)."""
        return sum(link.undeliverable for link in self._links)

    def begin_closing(self) -> None:
        """See :meth:`~omni_trio.control.sockets.base.SocketBackend.begin_closing`."""
        self._closing = True
        for link in self._links:
            link.begin_closing()

    def close(self) -> None:
        """Release the CURVE authenticator and destroy the ZMQ context (linger 0)."""
        if self._policy.curve is not None:
            self._policy.curve.close(self._context)
        self._context.destroy(linger=0)
