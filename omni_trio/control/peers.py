"""The sockets of one process: its inbox, a link to each peer process, and where each peer is reached.

The inbox ``<process>.sock`` in the run's IPC directory (a
:class:`~omni_trio.control.sockets.unix_link.UnixPull`) receives from this host; a ZMQ PULL socket on
``tcp://`` (CURVE) receives from other hosts. A peer on this host is reached at its inbox (a
:class:`~omni_trio.control.sockets.unix_link.UnixPush`), a peer on another host at its ``tcp://`` endpoint
(a :class:`~omni_trio.control.sockets.zmq_trio.TrioSocket` PUSH), which comes from the config, a Join or a
PeerAddresses message. Links open on first use. Every socket is built with the process's
:class:`~omni_trio.control.sockets.zmq_trio.SocketPolicy` (the run's proof on every message, the size cap),
and messages go only to the run's own processes: a name from a message never becomes a new socket
path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import zmq

from omni_trio.control.sockets.unix_link import UnixPull, UnixPush
from omni_trio.control.sockets.zmq_sockets import bind_pull, connect_push
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import encode


def socket_path(ipc_dir: Path, process: str) -> Path:
    """Where ``process`` receives its control messages."""
    return ipc_dir / f"{process}.sock"


class Peers:
    """The sockets of one process to and from the run's ``processes`` (see the module docstring).

    ``tcp`` holds the ``tcp://`` control endpoints of the peers known to be on other hosts; a worker
    that joined over TCP passes its ZMQ ``context`` and its bound receive socket ``pull``.
    ``tcp_peers`` are reached over TCP whatever their host (one of the two joined the run over TCP
    and has no socket in the other's directory); those not in ``tcp`` arrive in a PeerAddresses
    message.
    """

    def __init__(
        self,
        *,
        process: str,
        ipc_dir: Path,
        processes: frozenset[str],
        policy: SocketPolicy,
        tcp: dict[str, str] | None = None,
        context: zmq.Context[Any] | None = None,
        pull: TrioSocket | None = None,
        tcp_peers: frozenset[str] = frozenset(),
    ) -> None:
        self._process = process
        self._ipc_dir = ipc_dir
        self._processes = processes
        self._policy = policy
        self._ctx: zmq.Context[Any] = zmq.Context() if context is None else context
        #: Sockets other components opened on the context (omni_trio/runtime/remote/join.py): closed with these.
        self._adopted: list[TrioSocket] = []
        self._pull: TrioSocket | UnixPull | None = pull
        self._tcp = dict(tcp or {})
        #: Where this process receives over TCP (None: ipc only, or set by the socket passed as ``pull``).
        self.tcp_endpoint: str | None = None if pull is None else pull.source
        self._tcp_peers = tcp_peers
        self._peers_known = trio.Event()
        self._push: dict[str, TrioSocket | UnixPush] = {}

    def open_inbox(self) -> TrioSocket | UnixPull:
        """The socket this process receives on: the one passed as ``pull``, else its inbox, bound now."""
        if self._pull is None:
            self._pull = UnixPull(socket_path(self._ipc_dir, self._process), self._policy)
        return self._pull

    def bind(self, endpoint: str) -> TrioSocket:
        """A receive socket of its own bound at the ``tcp://`` ``endpoint`` (CURVE), closed with these
        (or by :meth:`release`)."""
        sock = bind_pull(self._ctx, endpoint, self._policy)
        self.adopt(sock)
        return sock

    def listen_tcp(self, endpoint: str) -> TrioSocket:
        """Receive also at the ``tcp://`` ``endpoint`` (peers on other hosts): it becomes :attr:`tcp_endpoint`."""
        sock = self.bind(endpoint)
        self.tcp_endpoint = sock.source
        return sock

    def learn_address(self, process: str, endpoint: str) -> None:
        """``process`` (one of the run's) is reached over TCP at ``endpoint`` (a new address, after a
        restart, replaces the connection to the old one)."""
        if process not in self._processes:
            raise LookupError(f"{process[:80]!r} is not a process of this run")
        if self._tcp.get(process) != endpoint:
            # A new incarnation (it rejoined elsewhere): what is queued for the old one was for the
            # incarnation that died, whose requests failed with it.
            self._close_push(process)
        self._tcp[process] = endpoint

    async def on_peer_addresses(self, message: m.PeerAddresses) -> None:
        """Learn the addresses of the peers reached over TCP (the runner sends them once every
        worker is ready, and again after a restart)."""
        for process, endpoint in message.addresses.items():
            if process in self._tcp_peers:
                self.learn_address(process, endpoint)
        self._peers_known.set()

    def release(self, sock: TrioSocket) -> None:
        """Close ``sock`` (one :meth:`adopt` took) now."""
        if sock in self._adopted:
            self._adopted.remove(sock)
        sock.close()

    def forget(self, process: str) -> None:
        """``process`` is gone: a process on another host is forgotten (its next incarnation joins at
        an address of its own)."""
        if self._tcp.pop(process, None) is not None:
            self._close_push(process)

    def _close_push(self, process: str) -> None:
        sock = self._push.pop(process, None)
        if sock is not None:
            sock.close()  # linger 0: what it still queued is dropped

    @property
    def refused(self) -> int:
        """Messages this process refused: without the run's proof, or in a stream that broke the
        link's wire format (:attr:`~omni_trio.control.sockets.unix_link.UnixPull.refused_streams`)."""
        streams = self._pull.refused_streams if isinstance(self._pull, UnixPull) else 0
        return self._policy.auth.refused + streams

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's path (a dead worker)."""
        return sum(sock.undeliverable for sock in self._push.values() if isinstance(sock, UnixPush))

    @property
    def tcp_addresses(self) -> dict[str, str]:
        """The ``tcp://`` endpoints of the peers known to be on other hosts."""
        return dict(self._tcp)

    @property
    def context(self) -> zmq.Context[Any]:
        """The ZMQ context of these sockets (for sockets another component opens beside them: :meth:`adopt`)."""
        return self._ctx

    def adopt(self, sock: TrioSocket) -> None:
        """Close ``sock`` with these sockets."""
        self._adopted.append(sock)

    async def send(self, process: str, message: m.ControlMessage) -> None:
        """Send one control message to ``process``."""
        sock = self._push.get(process)
        if sock is None:
            if process in self._tcp_peers and process not in self._tcp:
                # The runner sends the peers' addresses once every worker is ready: a message
                # from a peer can reach us before that one does.
                await self._peers_known.wait()
            sock = self._socket_to(process)
        await sock.send_multipart(encode(message))

    def _socket_to(self, process: str) -> TrioSocket | UnixPush:
        sock = self._push.get(process)
        if sock is None:
            # A name from a message (a stats request's reply_to) must not open a socket per value.
            if process not in self._processes:
                raise LookupError(f"{process[:80]!r} is not a process of this run")
            address = self._tcp.get(process)
            if address is None:
                if process in self._tcp_peers:
                    raise LookupError(f"no tcp:// address of process {process!r} came in the run's PeerAddresses")
                # Same host: the Unix stream link (omni_trio/control/sockets/unix_link.py), not ZMQ.
                sock = self._push[process] = UnixPush(socket_path(self._ipc_dir, process), self._policy)
                return sock
            sock = self._push[process] = connect_push(self._ctx, address, self._policy)
        return sock

    def close(self) -> None:
        """Close every socket and the context (linger 0: what they still queued is dropped)."""
        for sock in [*self._push.values(), *([self._pull] if self._pull else []), *self._adopted]:
            sock.close()
        self._push.clear()
        if self._policy.curve is not None:
            self._policy.curve.close(self._ctx)
        self._ctx.destroy(linger=0)
