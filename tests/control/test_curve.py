"""CURVE on the run's TCP sockets (omni_trio/control/wire/curve.py): only peers with the run's key get in.

Real libzmq handshakes over loopback TCP. A refused peer's frames must never reach our code: the
run's FrameMac (which counts every message without a valid proof it sees) stays at zero refusals,
and the first message the bound socket returns is the legitimate peer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from omni_trio.control.sockets.zmq_sockets import bind_pull, connect_push
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire.auth import FrameMac, new_secret
from omni_trio.control.wire.curve import Curve, CurveKeys, new_curve_keys

_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH


def _policy(keys: CurveKeys | None, secret: bytes) -> SocketPolicy:
    return SocketPolicy(FrameMac(secret), 1 << 20, None if keys is None else Curve(keys))


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


async def _handshake_failure(monitor: TrioSocket) -> int:
    while True:
        event = parse_monitor_message(await monitor.recv_multipart())
        if event["event"] & _FAILED:
            return int(event["event"])


async def test_the_runs_peers_talk_over_tcp(ctx: zmq.Context[Any]) -> None:
    keys, secret = new_curve_keys(), new_secret()
    server = _policy(keys, secret)
    with trio.fail_after(10):
        pull = bind_pull(ctx, "tcp://127.0.0.1:*", server)
        assert pull.source.startswith("tcp://127.0.0.1:") and not pull.source.endswith("*")
        push = connect_push(ctx, pull.source, _policy(keys, secret))
        try:
            await push.send_multipart([b"hello", b"x" * 100_000])
            assert await pull.recv_multipart() == [b"hello", b"x" * 100_000]
        finally:
            push.close()
            pull.close()
            assert server.curve is not None
            server.curve.close(ctx)
    assert server.auth.refused == 0


@pytest.mark.parametrize("peer", ["no key", "wrong key pair", "wrong server key"])
async def test_a_peer_without_the_runs_key_is_refused_before_any_frame(ctx: zmq.Context[Any], peer: str) -> None:
    keys, secret = new_curve_keys(), new_secret()
    server = _policy(keys, secret)
    assert server.curve is not None
    pull = bind_pull(ctx, "tcp://127.0.0.1:*", server)
    monitor = TrioSocket(pull.socket.get_monitor_socket(_FAILED))
    # The intruder even knows the run's secret: only CURVE stands in its way.
    intruder: zmq.Socket[Any] = ctx.socket(zmq.PUSH)
    intruder.setsockopt(zmq.LINGER, 0)
    other = new_curve_keys()
    if peer == "wrong key pair":
        intruder.curve_serverkey, intruder.curve_publickey, intruder.curve_secretkey = keys.public, *attrs_of(other)
    elif peer == "wrong server key":
        intruder.curve_serverkey, intruder.curve_publickey, intruder.curve_secretkey = other.public, *attrs_of(keys)
    friend = connect_push(ctx, pull.source, _policy(keys, secret))
    try:
        with trio.fail_after(10):
            intruder.connect(pull.source)
            for _ in range(3):
                intruder.send_multipart(FrameMac(secret).seal([b"forged", b"payload"]), zmq.NOBLOCK)
            await _handshake_failure(monitor)
            await friend.send_multipart([b"real"])
            assert await pull.recv_multipart() == [b"real"]
            assert pull.recv_nowait() is None
    finally:
        intruder.close(linger=0)
        friend.close()
        monitor.close()
        pull.socket.disable_monitor()
        pull.close()
        server.curve.close(ctx)
    assert server.auth.refused == 0  # nothing of the intruder reached the proof check, let alone a decoder
    # ZAP sees (and counts) only a peer that knows the server's key but presents another key.
    assert server.curve.refused == (1 if peer == "wrong key pair" else 0)


def attrs_of(keys: CurveKeys) -> tuple[bytes, bytes]:
    """A key pair as (public, secret)."""
    return keys.public, keys.secret


def test_tcp_without_curve_keys_is_refused(ctx: zmq.Context[Any]) -> None:
    with pytest.raises(ValueError, match="need the run's CURVE keys"):
        bind_pull(ctx, "tcp://127.0.0.1:*", _policy(None, new_secret()))
    with pytest.raises(ValueError, match="need the run's CURVE keys"):
        connect_push(ctx, "tcp://127.0.0.1:5", _policy(None, new_secret()))


def test_the_secret_key_is_never_printed() -> None:
    keys = new_curve_keys()
    assert keys.secret.decode() not in repr(keys) and keys.public.decode() in repr(keys)


async def test_a_frame_of_the_largest_accepted_size_crosses_tcp(ctx: zmq.Context[Any]) -> None:
    # libzmq checks ZMQ_MAXMSGSIZE on the encrypted frame, which CURVE makes a little bigger.
    keys, secret = new_curve_keys(), new_secret()
    server = _policy(keys, secret)
    assert server.curve is not None
    pull = bind_pull(ctx, "tcp://127.0.0.1:*", server)
    push = connect_push(ctx, pull.source, _policy(keys, secret))
    try:
        with trio.fail_after(10):
            await push.send_multipart([b"t", b"x" * server.max_message_bytes])
            assert [len(f) for f in await pull.recv_multipart()] == [1, server.max_message_bytes]
    finally:
        push.close()
        pull.close()
        server.curve.close(ctx)
