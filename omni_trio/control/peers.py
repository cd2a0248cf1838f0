"""The sockets of one process: its inbox, a link to each peer process, and where each peer is reached.

The sockets come from the process's :class:`~omni_trio.control.sockets.base.SocketBackend` (the
real one: :class:`~omni_trio.control.sockets.host.HostSockets`). The inbox receives from this host;
an inbox bound at a ``tcp://`` address receives from other hosts. A peer on this host is reached at
its inbox, a peer on another host at its ``tcp://`` address, which comes from the config, a Join or
a PeerAddresses message. Links open on first use, and messages go only to the run's own processes:
a name from a message never becomes a new socket.
"""

from __future__ import annotations

import trio

from omni_trio.control.sockets.base import Inbox, Link, SocketBackend
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import encode

#: Messages that go before whatever else waits to be sent on their link: an abort must reach a stage
#: before the work it stops (not behind a burst of submits), and its confirmation must not wait
#: behind the results the caller is receiving.
URGENT = (m.Abort, m.AbortDone)


class Peers:
    """The sockets of one process to and from the run's ``processes`` (see the module docstring).

    ``sockets`` makes them. ``tcp`` holds the ``tcp://`` control addresses of the peers known to be
    on other hosts; a worker that joined over TCP passes the ``inbox`` it bound for its join.
    ``tcp_peers`` are reached over TCP whatever their host (one of the two joined the run over TCP
    and has no inbox on the other's host); those not in ``tcp`` arrive in a PeerAddresses message.
    """

    def __init__(
        self,
        *,
        process: str,
        processes: frozenset[str],
        sockets: SocketBackend,
        tcp: dict[str, str] | None = None,
        inbox: Inbox | None = None,
        tcp_peers: frozenset[str] = frozenset(),
    ) -> None:
        self._process = process
        self._processes = processes
        self._sockets = sockets
        #: Sockets other components opened beside these (omni_trio/runtime/remote/join.py): closed with these.
        self._adopted: list[Link | Inbox] = []
        self._inbox: Inbox | None = inbox
        self._tcp = dict(tcp or {})
        #: Where this process receives over TCP (None: on this host only, or the ``inbox`` passed in).
        self.tcp_address: str | None = None if inbox is None else inbox.source
        self._tcp_peers = tcp_peers
        self._peers_known = trio.Event()
        self._links: dict[str, Link] = {}

    def open_inbox(self) -> Inbox:
        """The socket this process receives on: the ``inbox`` passed in, else its inbox on this host, bound now."""
        if self._inbox is None:
            self._inbox = self._sockets.bind_local(self._process)
        return self._inbox

    def bind(self, address: str) -> Inbox:
        """A receive socket of its own bound at the ``tcp://`` ``address``, closed with these (or by
        :meth:`release`)."""
        sock = self._sockets.bind_tcp(address)
        self.adopt(sock)
        return sock

    def listen_tcp(self, address: str) -> Inbox:
        """Receive also at the ``tcp://`` ``address`` (peers on other hosts): it becomes :attr:`tcp_address`."""
        sock = self.bind(address)
        self.tcp_address = sock.source
        return sock

    def learn_address(self, process: str, address: str) -> None:
        """``process`` (one of the run's) is reached over TCP at ``address`` (a new address, after a
        restart, replaces the connection to the old one)."""
        if process not in self._processes:
            raise LookupError(f"{process[:80]!r} is not a process of this run")
        if self._tcp.get(process) != address:
            # A new incarnation (it rejoined elsewhere): what is queued for the old one was for the
            # incarnation that died, whose requests failed with it.
            self._close_link(process)
        self._tcp[process] = address

    def on_peer_addresses(self, message: m.PeerAddresses) -> None:
        """Learn the addresses of the peers reached over TCP (the runner sends them once every
        worker is ready, and again after a restart)."""
        for process, address in message.addresses.items():
            if process in self._tcp_peers:
                self.learn_address(process, address)
        self._peers_known.set()

    def release(self, sock: Link | Inbox) -> None:
        """Close ``sock`` (one :meth:`adopt` took) now."""
        if sock in self._adopted:
            self._adopted.remove(sock)
        sock.close()

    def forget(self, process: str) -> None:
        """``process`` is gone: a process on another host is forgotten (its next incarnation joins at
        an address of its own)."""
        if self._tcp.pop(process, None) is not None:
            self._close_link(process)

    def _close_link(self, process: str) -> None:
        link = self._links.pop(process, None)
        if link is not None:
            link.close()  # what it still queued is dropped

    @property
    def refused(self) -> int:
        """Messages this process refused: without the run's proof, or in a stream that broke the
        link's wire format (:attr:`SocketBackend.refused_streams
        <omni_trio.control.sockets.base.SocketBackend.refused_streams>`)."""
        return self._sockets.policy.auth.refused + self._sockets.refused_streams

    @property
    def refused_connections(self) -> int:
        """Connections this process's inboxes closed for their limits (:attr:`SocketBackend.refused_connections
        <omni_trio.control.sockets.base.SocketBackend.refused_connections>`)."""
        return self._sockets.refused_connections

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's inbox (a dead worker)."""
        return self._sockets.undeliverable

    @property
    def tcp_addresses(self) -> dict[str, str]:
        """The ``tcp://`` addresses of the peers known to be on other hosts."""
        return dict(self._tcp)

    def adopt(self, sock: Link | Inbox) -> None:
        """Close ``sock`` with these sockets."""
        self._adopted.append(sock)

    async def send(self, process: str, message: m.ControlMessage) -> None:
        """Send one control message to ``process``; an abort or its confirmation goes before the
        messages other tasks are waiting to send there (:data:`URGENT`)."""
        link = self._links.get(process)
        if link is None:
            if process in self._tcp_peers and process not in self._tcp:
                # The runner sends the peers' addresses once every worker is ready: a message
                # from a peer can reach us before that one does.
                await self._peers_known.wait()
            link = self._link_to(process)
        await link.send_multipart(encode(message), urgent=isinstance(message, URGENT))

    def _link_to(self, process: str) -> Link:
        link = self._links.get(process)
        if link is None:
            # A name from a message (a stats request's reply_to) must not open a socket per value.
            if process not in self._processes:
                raise LookupError(f"{process[:80]!r} is not a process of this run")
            address = self._tcp.get(process)
            if address is None:
                if process in self._tcp_peers:
                    raise LookupError(f"no tcp:// address of process {process!r} came in the run's PeerAddresses")
                link = self._links[process] = self._sockets.connect_local(process)
            else:
                link = self._links[process] = self._sockets.connect_tcp(address)
        return link

    def close(self) -> None:
        """Close every socket, then the backend (what they still queued is dropped)."""
        for sock in [*self._links.values(), *([self._inbox] if self._inbox else []), *self._adopted]:
            sock.close()
        self._links.clear()
        self._sockets.close()
