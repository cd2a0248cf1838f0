"""How a run's zmq sockets are made: endpoints, options, CURVE, heartbeats; a connection watched for its drop.

Endpoints are ``ipc://`` paths or ``tcp://``. The bound socket file is chmod'ed to 0600,
but there is a short window after ``bind`` with the umask's mode: create
endpoints inside a private (0700) directory. Between hosts they are
``tcp://HOST:PORT`` (``tcp://HOST:*`` to bind any free port; the socket's
:attr:`~omni_trio.control.sockets.zmq_trio.TrioSocket.source` then says which): only with a policy that has the
run's :class:`~omni_trio.control.wire.curve.Curve` (CURVE keys and ZAP, which
refuse a peer without the run's key before any frame reaches us).

A socket made here is a :class:`~omni_trio.control.sockets.zmq_trio.TrioSocket` with the run's
:class:`~omni_trio.control.sockets.zmq_trio.SocketPolicy`: ``ZMQ_MAXMSGSIZE`` from its limit (plus what CURVE
adds on TCP), no linger, ZMTP heartbeats on TCP, and ``ZMQ_HANDSHAKE_IVL`` from the inbox limits'
``proof_timeout_s`` (a TCP connection proves itself by finishing the CURVE handshake, which only a
holder of the run's key can; before that it can send no message). The other inbox limits have no
libzmq counterpart and need none on TCP: a peer that passed the handshake is the run's, and a
handshake only starts on a connection libzmq accepted (libzmq caps neither the number of
connections nor what a connection's unfinished message holds, up to ``ZMQ_MAXMSGSIZE``).
"""

from __future__ import annotations

import os
from typing import Any

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire.curve import Curve
from omni_trio.errors import OmniTrioError

__all__ = [
    "MAX_IPC_PATH",
    "EndpointPathTooLong",
    "bind_pull",
    "connect_push",
    "connect_watched",
    "ipc_endpoint",
    "wait_dropped",
]

#: Longest accepted ipc path in bytes (sun_path is 108 bytes on Linux,
#: keep a margin for libzmq's own bookkeeping).
MAX_IPC_PATH = 99

IpcPath = str | os.PathLike[str]


class EndpointPathTooLong(OmniTrioError, ValueError):
    """An ipc:// socket path does not fit a Unix socket address."""


def ipc_endpoint(path: IpcPath) -> tuple[str, str]:
    """Return ``(endpoint, filesystem_path)`` for an ipc path (``ipc://`` optional).

    Raises EndpointPathTooLong when the path does not fit a Unix socket address.
    """
    raw = os.fspath(path)
    if raw.startswith("ipc://"):
        raw = raw[len("ipc://") :]
    if not raw:
        raise ValueError("empty ipc path")
    size = len(os.fsencode(raw))
    if size > MAX_IPC_PATH:
        raise EndpointPathTooLong(
            f"ipc socket path is {size} bytes, the limit is {MAX_IPC_PATH} "
            f"(Unix socket addresses are short); use a shorter directory: {raw!r}"
        )
    return "ipc://" + raw, raw


def _new_socket(ctx: zmq.Context[Any], kind: int, policy: SocketPolicy, hwm: int | None) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = ctx.socket(kind)
    # Never let Context.term() hang on undeliverable messages.
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq drops a peer that announces a bigger frame before reading (or allocating) it.
    sock.setsockopt(zmq.MAXMSGSIZE, policy.max_message_bytes)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


def _curve(policy: SocketPolicy, endpoint: str) -> Curve:
    if policy.curve is None:
        raise ValueError(f"{endpoint}: tcp:// sockets need the run's CURVE keys (SocketPolicy.curve)")
    return policy.curve


#: ZMTP heartbeats on TCP connections: a peer that stops answering (its host is gone, the network
#: is cut) is disconnected within about a second, which a dead process's closed socket tells at once.
HEARTBEAT_IVL_MS = 250
HEARTBEAT_TIMEOUT_MS = 1000


#: What CURVE adds to each frame on the wire (the MESSAGE command's name, nonce, box and flags):
#: libzmq checks ZMQ_MAXMSGSIZE on the encrypted frame, so TCP sockets allow this much more.
CURVE_FRAME_OVERHEAD = 64


def _tcp(sock: zmq.Socket[Any], policy: SocketPolicy) -> None:
    sock.setsockopt(zmq.MAXMSGSIZE, policy.max_message_bytes + CURVE_FRAME_OVERHEAD)
    # A connection must finish its handshake (CURVE, and ZAP's check of the run's key) in the time a
    # Unix connection has to prove itself: until then it holds a descriptor and cannot send a message.
    sock.setsockopt(zmq.HANDSHAKE_IVL, max(1, round(policy.limits.proof_timeout_s * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)


def _bind(ctx: zmq.Context[Any], kind: int, path: IpcPath, policy: SocketPolicy, hwm: int | None) -> TrioSocket:
    tcp = os.fspath(path).startswith("tcp://")
    endpoint, fs_path = (os.fspath(path), "") if tcp else ipc_endpoint(path)
    sock = _new_socket(ctx, kind, policy, hwm)
    try:
        if tcp:
            _curve(policy, endpoint).serve(ctx, sock)
            _tcp(sock, policy)
            sock.bind(endpoint)
            source = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            sock.bind(endpoint)
            # Only our user may connect (one more line of defence besides the run's proofs).
            os.chmod(fs_path, 0o600)
            source = fs_path
    except BaseException:
        sock.close(linger=0)
        raise
    return TrioSocket(sock, policy, source=source)


def _connect(
    ctx: zmq.Context[Any], kind: int, path: IpcPath, policy: SocketPolicy, hwm: int | None, monitor_events: int = 0
) -> tuple[TrioSocket, zmq.Socket[Any] | None]:
    tcp = os.fspath(path).startswith("tcp://")
    endpoint, source = (os.fspath(path),) * 2 if tcp else ipc_endpoint(path)
    sock = _new_socket(ctx, kind, policy, hwm)
    monitor = None
    try:
        if tcp:
            _curve(policy, endpoint).client(sock)
            _tcp(sock, policy)
        if monitor_events:
            monitor = sock.get_monitor_socket(monitor_events)
        sock.connect(endpoint)
    except BaseException:
        if monitor is not None:
            monitor.close(linger=0)
        sock.close(linger=0)
        raise
    return TrioSocket(sock, policy, source=source), monitor


def bind_pull(ctx: zmq.Context[Any], path: IpcPath, policy: SocketPolicy, *, hwm: int | None = None) -> TrioSocket:
    """Bind a PULL socket (a stage's or the coordinator's inbox) at ``ipc://path`` (or a ``tcp://`` endpoint)."""
    return _bind(ctx, zmq.PULL, path, policy, hwm)


def connect_push(ctx: zmq.Context[Any], path: IpcPath, policy: SocketPolicy, *, hwm: int | None = None) -> TrioSocket:
    """Connect a PUSH socket to ``ipc://path`` or a ``tcp://`` endpoint (the peer may bind later)."""
    return _connect(ctx, zmq.PUSH, path, policy, hwm)[0]


def connect_watched(ctx: zmq.Context[Any], path: IpcPath, policy: SocketPolicy) -> tuple[TrioSocket, TrioSocket]:
    """:func:`connect_push`, and a monitor of the connection's handshakes and drops attached before it
    connects: neither event can be missed (a monitor attached after ``connect`` misses a fast handshake)."""
    sock, monitor = _connect(
        ctx, zmq.PUSH, path, policy, None, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
    )
    assert monitor is not None
    return sock, TrioSocket(monitor)


async def wait_dropped(monitor: TrioSocket) -> None:
    """Return once the connection :func:`connect_watched` watches dropped after its handshake (or the
    monitor closed). A drop before any handshake (a refused or failed attempt, which libzmq retries)
    does not count."""
    connected = False
    while True:
        try:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
        except trio.ClosedResourceError:
            return
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            connected = True
        elif event == zmq.EVENT_DISCONNECTED and connected:
            return


