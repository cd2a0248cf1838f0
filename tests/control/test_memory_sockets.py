"""The in-memory socket backend keeps the promises of the interface (omni_trio/control/sockets/base.py)
that the real backends keep (tests/control/test_unix_link.py, test_zmq_trio.py)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from omni_trio.control.sockets.memory import MemoryNetwork
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import FrameMac, new_secret
from omni_trio.control.wire.codec import decode, encode
from omni_trio.errors import MessageTooLarge

SECRET = new_secret()


def policy(secret: bytes = SECRET) -> SocketPolicy:
    return SocketPolicy(FrameMac(secret), 1 << 16)


def stats(token: int) -> list[bytes]:
    return encode(m.StatsRequest(reply_to="main", token=token))


def token(frames: list[bytes]) -> int:
    message = decode(frames)
    assert isinstance(message, m.StatsRequest)
    return message.token


async def test_a_link_delivers_in_order_and_a_full_inbox_makes_its_sender_wait() -> None:
    network = MemoryNetwork(capacity=2)
    inbox = network.sockets("p", policy()).bind_local("p")
    link = network.sockets("main", policy()).connect_local("p")
    with trio.fail_after(5):
        await link.send_multipart(stats(0))
        await link.send_multipart(stats(1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.send_multipart, stats(2))
            await trio.testing.wait_all_tasks_blocked()
            assert network.sent(m.StatsRequest)[-1].message == m.StatsRequest(reply_to="main", token=2)
            assert inbox.recv_nowait() is not None  # room: the waiting send goes on
        assert [token(await inbox.recv_multipart()) for _ in range(2)] == [1, 2]
        assert inbox.recv_nowait() is None


async def test_a_message_without_the_runs_proof_is_refused_and_one_too_big_is_not_sent() -> None:
    network = MemoryNetwork()
    receiving = policy()
    inbox = network.sockets("p", receiving).bind_local("p")
    stranger = network.sockets("x", policy(new_secret())).connect_local("p")
    await stranger.send_multipart(stats(0))
    assert inbox.recv_nowait() is None and receiving.auth.refused == 1
    with pytest.raises(MessageTooLarge):
        await network.sockets("main", policy()).connect_local("p").send_multipart([b"x" * (1 << 16)])


async def test_a_peer_gone_loses_what_is_sent_to_it_until_it_binds_again() -> None:
    network = MemoryNetwork()
    sockets = network.sockets("main", policy())
    link = sockets.connect_local("p")
    first = network.sockets("p", policy()).bind_local("p")
    network.kill("p")
    with pytest.raises(trio.ClosedResourceError):
        await first.recv_multipart()
    await link.send_multipart(stats(1))
    assert sockets.undeliverable == 1 and network.log[-1].fate == "undeliverable"
    again = network.sockets("p", policy()).bind_local("p")  # the restart
    await link.send_multipart(stats(2))
    assert token(again.recv_nowait() or []) == 2


async def test_faults_drop_duplicate_and_hold_back_one_connection() -> None:
    network = MemoryNetwork()
    inbox = network.sockets("p", policy()).bind_local("p")
    a = network.sockets("a", policy()).connect_local("p")
    b = network.sockets("b", policy()).connect_local("p")
    network.drop("a", "p", m.StatsRequest, where=lambda message: message.token == 0)  # type: ignore[attr-defined]
    network.duplicate("a", "p", m.StatsRequest, where=lambda message: message.token == 1)  # type: ignore[attr-defined]
    network.hold("a", "p")
    for n in range(3):
        await a.send_multipart(stats(n))
    await b.send_multipart(stats(10))
    await network.release("a", "p")
    received = []
    while (frames := inbox.recv_nowait()) is not None:
        received.append(token(frames))
    assert received == [10, 1, 1, 2]
    assert [entry.fate for entry in network.log] == ["dropped", "delivered", "delivered", "delivered"]
