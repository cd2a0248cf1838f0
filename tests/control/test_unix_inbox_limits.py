"""The inbox keeps serving whatever connections do to it (omni_trio/control/sockets/unix_inbox.py): the
proof and message deadlines on trio's MockClock, the cap on unproven connections, the cap on unfinished
bytes, and ``accept`` without a free descriptor; a genuine sender is served throughout."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from omni_trio.control.sockets.framing import message_head
from omni_trio.control.sockets.limits import InboxLimits
from omni_trio.control.sockets.unix_inbox import UnixPull
from omni_trio.control.sockets.unix_link import UnixPush
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire.auth import FrameMac, new_secret

LIMITS = InboxLimits(max_unproven_connections=4, proof_timeout_s=5.0, message_timeout_s=30.0,
                     max_unfinished_bytes=1 << 20)


def _policy(limits: InboxLimits = LIMITS) -> SocketPolicy:
    return SocketPolicy(FrameMac(new_secret()), 1 << 20, limits=limits)


@pytest.fixture
def inbox_path() -> Iterator[str]:
    """Where an inbox binds, in a short private directory."""
    directory = tempfile.mkdtemp(prefix="ot-limits-", dir="/tmp")
    os.chmod(directory, 0o700)
    yield os.path.join(directory, "inbox.sock")
    shutil.rmtree(directory, ignore_errors=True)


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.setblocking(False)
    return sock


async def _closed_by_peer(sock: socket.socket) -> None:
    """Return once the inbox closed ``sock``'s connection (what it sent unread, or not)."""
    while True:
        await trio.lowlevel.wait_readable(sock)
        try:
            if not sock.recv(1):
                return
        except ConnectionResetError:
            return


async def _served(pull: UnixPull, push: UnixPush, body: bytes) -> None:
    await push.send_multipart([body])
    assert await pull.recv_multipart() == [body]


async def _receive_loop(pull: UnixPull, got: list[list[bytes]]) -> None:
    """What the endpoint's receive loop does: receive, for ever (its waits enforce the deadlines)."""
    while True:
        got.append(await pull.recv_multipart())


async def test_an_unproven_connection_is_closed_at_the_proof_timeout(
    inbox_path: str, autojump_clock: trio.testing.MockClock
) -> None:
    policy = _policy()
    with trio.fail_after(1000), UnixPull(inbox_path, policy) as pull:  # virtual seconds
        idle, forger = _raw(inbox_path), _raw(inbox_path)
        forger.sendall(message_head([3, 16]) + b"tag" + b"\0" * 16)  # a message, without the run's proof
        push = UnixPush(inbox_path, policy)
        start = trio.current_time()
        got: list[list[bytes]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_receive_loop, pull, got)
            await push.send_multipart([b"genuine"])  # proves its connection at once
            await _closed_by_peer(idle)
            await _closed_by_peer(forger)
            assert trio.current_time() - start == pytest.approx(LIMITS.proof_timeout_s)
            await trio.sleep(10 * LIMITS.message_timeout_s)  # the proven connection has no deadline
            nursery.cancel_scope.cancel()
        assert got == [[b"genuine"]]
        assert pull.refused_connections == 2 and policy.auth.refused == 1
        await _served(pull, push, b"later")
        assert pull.refused_connections == 2
        for sock in (idle, forger, push):
            sock.close()


async def test_a_message_unfinished_after_its_time_limit_is_dropped(
    inbox_path: str, autojump_clock: trio.testing.MockClock
) -> None:
    policy = _policy()
    with trio.fail_after(300), UnixPull(inbox_path, policy) as pull:
        sender = _raw(inbox_path)
        sender.sendall(b"".join(message_head([len(f) for f in frames]) + b"".join(frames)
                                for frames in [[bytes(f) for f in policy.auth.seal([b"first"])]]))
        assert await pull.recv_multipart() == [b"first"]  # proven
        sender.sendall(message_head([1000]) + b"x" * 10)  # and then half a message, never finished
        push = UnixPush(inbox_path, policy)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_receive_loop, pull, [])
            await _closed_by_peer(sender)
            assert trio.current_time() - start == pytest.approx(LIMITS.message_timeout_s)
            nursery.cancel_scope.cancel()
        assert pull.refused_connections == 1
        await _served(pull, push, b"still served")
        sender.close()
        push.close()


async def test_more_unproven_connections_than_the_cap_evict_the_oldest(inbox_path: str) -> None:
    policy = _policy()
    with trio.fail_after(10), UnixPull(inbox_path, policy) as pull:
        flood = [_raw(inbox_path) for _ in range(50)]
        push = UnixPush(inbox_path, policy)
        await _served(pull, push, b"genuine")
        # The newest few are held (unproven, for now); every other one was closed and counted.
        assert pull.refused_connections == 50 + 1 - LIMITS.max_unproven_connections
        for sock in flood[: 50 - LIMITS.max_unproven_connections + 1]:
            await _closed_by_peer(sock)
        await _served(pull, push, b"again")
        for sock in [*flood, push]:
            sock.close()


async def _hoard(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` (half a message) and keep the connection open until the inbox closes it."""
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    with contextlib.suppress(trio.BrokenResourceError):
        await stream.send_all(data)
    await _closed_by_peer(sock)


async def test_unfinished_messages_over_the_cap_close_the_oldest_unproven_hoarders_first(inbox_path: str) -> None:
    policy = _policy()
    cap = LIMITS.max_unfinished_bytes
    with trio.fail_after(10), UnixPull(inbox_path, policy) as pull:
        push = UnixPush(inbox_path, policy)
        got: list[list[bytes]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_receive_loop, pull, got)
            async with trio.open_nursery() as senders:
                # Unproven, each half a message of 600 KiB: together over the cap, as with the genuine one.
                for _ in range(2):
                    senders.start_soon(_hoard, _raw(inbox_path), message_head([900_000]) + b"h" * (600 << 10))
                senders.start_soon(push.send_multipart, [b"a" * (cap // 2)])  # unproven until it is whole
            # Both hoarders were closed (the oldest unproven go first), the genuine message fits.
            nursery.cancel_scope.cancel()
        assert got == [[b"a" * (cap // 2)]]
        assert pull.refused_connections == 2
        await _served(pull, push, b"still served")
        push.close()


def _lowest_free_fd() -> int:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


async def test_accept_without_a_free_descriptor_closes_the_waiting_connections(inbox_path: str) -> None:
    policy = _policy()
    with trio.fail_after(10), UnixPull(inbox_path, policy) as pull:
        waiting = [_raw(inbox_path) for _ in range(10)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (_lowest_free_fd(), hard))  # the next descriptor: EMFILE
        try:
            assert pull.recv_nowait() is None  # accept fails with EMFILE: refused, not raised
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert pull.refused_connections == 10
        for sock in waiting:
            await _closed_by_peer(sock)
        push = UnixPush(inbox_path, policy)
        await _served(pull, push, b"served after")
        for sock in [*waiting, push]:
            sock.close()
