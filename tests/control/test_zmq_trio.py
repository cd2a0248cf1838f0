"""pyzmq on trio: edge-triggered FD waiting, HWM back-pressure, close, ipc helpers."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator

import pytest
import trio
import trio.testing
import zmq

from omni_trio.control.sockets.zmq_sockets import EndpointPathTooLong, bind_pull, connect_push, ipc_endpoint
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire.auth import FrameMac, new_secret

#: The sockets of a run, as the runtime builds them: every message sealed and checked.
POLICY = SocketPolicy(FrameMac(new_secret()), 1 << 20)


@pytest.fixture
def ipc_dir() -> Iterator[str]:
    """A short private directory for ipc:// socket files (pytest's tmp_path can be too long)."""
    path = tempfile.mkdtemp(prefix="ot-zmq-", dir="/tmp")
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.term()


async def test_push_pull_round_trip(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "inbox")
        with bind_pull(ctx, path, POLICY) as pull, connect_push(ctx, path, POLICY) as push:
            await push.send_multipart([b"tag", b"body", b""])
            assert await pull.recv_multipart() == [b"tag", b"body", b""]
            await push.send_multipart([bytearray(b"x" * 200_000), memoryview(b"y")])  # zero-copy sized frame
            frames = await pull.recv_multipart()
            assert frames == [b"x" * 200_000, b"y"]


async def test_many_messages_in_order_with_concurrent_senders(
    ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str
) -> None:
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "many")
        count = 2000
        with bind_pull(ctx, path, POLICY, hwm=50) as pull, connect_push(ctx, path, POLICY, hwm=50) as push:
            received: dict[bytes, list[int]] = {b"a": [], b"b": []}

            async def sender(name: bytes) -> None:
                for i in range(count):
                    await push.send_multipart([name, i.to_bytes(4, "big")])

            async def receiver() -> None:
                for _ in range(2 * count):
                    name, raw = await pull.recv_multipart()
                    received[name].append(int.from_bytes(raw, "big"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receiver)
                nursery.start_soon(sender, b"a")
                nursery.start_soon(sender, b"b")
            # per-sender FIFO order, nothing lost or duplicated
            assert received[b"a"] == list(range(count))
            assert received[b"b"] == list(range(count))


async def test_send_blocks_at_hwm_and_resumes(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "hwm")
        # Nobody is bound yet: messages wait in the PUSH pipe, bounded by its HWM.
        push = connect_push(ctx, path, POLICY, hwm=2)
        sent = 0
        total = 20

        async def sender() -> None:
            nonlocal sent
            for i in range(total):
                await push.send_multipart([b"%d" % i])
                sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            await trio.testing.wait_all_tasks_blocked()
            assert 0 < sent < total  # blocked at the high-water mark, not polling
            stuck = sent
            await trio.sleep(0.05)
            assert sent == stuck
            with bind_pull(ctx, path, POLICY, hwm=2) as pull:
                got = [await pull.recv_multipart() for _ in range(total)]
        assert got == [[b"%d" % i] for i in range(total)]
        push.close()


async def test_close_wakes_a_pending_recv(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        pull = bind_pull(ctx, os.path.join(ipc_dir, "closing"), POLICY)
        outcome: list[str] = []

        async def receiver() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await pull.recv_multipart()
            outcome.append("closed")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            await trio.testing.wait_all_tasks_blocked()
            pull.close()
        assert outcome == ["closed"]
        with pytest.raises(trio.ClosedResourceError):
            await pull.recv_multipart()
        pull.close()  # idempotent


async def test_close_wakes_both_directions(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        # A DEALER with no peer blocks both on send and on recv: two waiters on one fd.
        dealer = TrioSocket(ctx.socket(zmq.DEALER))
        dealer.socket.bind(ipc_endpoint(os.path.join(ipc_dir, "both"))[0])
        closed: list[str] = []

        async def op(name: str) -> None:
            with pytest.raises(trio.ClosedResourceError):
                if name == "send":
                    await dealer.send_multipart([b"x"])
                else:
                    await dealer.recv_multipart()
            closed.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(op, "recv")
            nursery.start_soon(op, "send")
            await trio.testing.wait_all_tasks_blocked()
            dealer.close()
        assert sorted(closed) == ["recv", "send"]


async def test_send_and_recv_waiting_on_one_socket(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        endpoint = ipc_endpoint(os.path.join(ipc_dir, "duplex"))[0]
        with TrioSocket(ctx.socket(zmq.DEALER)) as a, TrioSocket(ctx.socket(zmq.DEALER)) as b:
            a.socket.setsockopt(zmq.LINGER, 0)
            b.socket.setsockopt(zmq.LINGER, 0)
            a.socket.bind(endpoint)
            got: list[list[bytes]] = []

            async def recv_on_a() -> None:
                got.append(await a.recv_multipart())

            async def send_on_a() -> None:
                await a.send_multipart([b"to-b"])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(recv_on_a)
                nursery.start_soon(send_on_a)
                await trio.testing.wait_all_tasks_blocked()  # both wait on a's one fd
                b.socket.connect(endpoint)
                assert await b.recv_multipart() == [b"to-b"]  # a's sender woke up
                await b.send_multipart([b"to-a"])  # and a's receiver does too
            assert got == [[b"to-a"]]


async def test_cancelled_recv_loses_nothing(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "cancel")
        with bind_pull(ctx, path, POLICY) as pull, connect_push(ctx, path, POLICY) as push:
            with trio.move_on_after(0.02):
                await pull.recv_multipart()
            await push.send_multipart([b"after"])
            assert await pull.recv_multipart() == [b"after"]


async def test_bound_socket_file_is_private(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "private")
        for bind in (bind_pull,):
            with bind(ctx, path, POLICY):
                mode = os.stat(path).st_mode
                assert stat.S_ISSOCK(mode)
                assert stat.S_IMODE(mode) == 0o600


def test_ipc_path_too_long(ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    long_path = "/tmp/" + "x" * 120
    for helper in (bind_pull, connect_push):
        with pytest.raises(EndpointPathTooLong, match="limit is 99"):
            helper(ctx, long_path, POLICY)
    assert ipc_endpoint("ipc:///tmp/a") == ("ipc:///tmp/a", "/tmp/a")
    assert ipc_endpoint("/tmp/" + "y" * 94)[1].endswith("y")


async def test_messages_without_the_runs_proof_are_refused(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    auth = FrameMac(new_secret())
    other_run = FrameMac(new_secret())
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "sealed")
        with bind_pull(ctx, path, SocketPolicy(auth, 1 << 20)) as pull:
            raw = ctx.socket(zmq.PUSH)  # one connection: what it sends arrives in order
            raw.connect(f"ipc://{path}")
            try:
                good = auth.seal([b"tag", b"body"])
                forged = [
                    [b"tag", b"body"],  # no proof
                    [b"tag", b"body", b"\x00" * 16],  # a made-up one
                    other_run.seal([b"tag", b"body"]),  # another run's
                    [b"tag", b"bodx", good[-1]],  # a changed body
                    [b"tagbody", good[-1]],  # frames joined
                    [b"tag", b"bo", b"dy", good[-1]],  # frames split
                    [good[-1]],  # the proof alone
                    [bytes(good[-1])[:8]],  # truncated
                ]
                for frames in forged:
                    raw.send_multipart(frames)
                raw.send_multipart(auth.seal([b"after"]))
                # Each refused message is consumed and skipped: the first one returned is the genuine one.
                assert await pull.recv_multipart() == [b"after"]
                assert auth.refused == len(forged)
                raw.send_multipart([b"x"])
                raw.send_multipart(good)
                with trio.fail_after(5):
                    while (frames := pull.recv_nowait()) is None:  # recv_nowait skips the forged one too
                        await trio.sleep(0.001)
                assert frames == [b"tag", b"body"]
                assert auth.refused == len(forged) + 1
            finally:
                raw.close(linger=0)


async def test_frames_over_the_cap_are_refused_by_both_ends(ctx: zmq.Context[zmq.Socket[bytes]], ipc_dir: str) -> None:
    from omni_trio.errors import MessageTooLarge

    auth = FrameMac(new_secret())
    policy = SocketPolicy(auth, 64 * 1024)
    with trio.fail_after(10):
        path = os.path.join(ipc_dir, "capped")
        with bind_pull(ctx, path, policy) as pull, connect_push(ctx, path, policy) as push:
            with pytest.raises(MessageTooLarge, match="max_message_bytes"):
                await push.send_multipart([b"tag", b"x" * (64 * 1024 + 1)])
            raw = ctx.socket(zmq.PUSH)
            raw.connect(f"ipc://{path}")
            try:
                raw.send_multipart(auth.seal([b"big", b"x" * (1 << 20)]))  # libzmq drops this peer unread
                await push.send_multipart([b"tag", b"x" * (64 * 1024)])  # at the cap: fine
                assert await pull.recv_multipart() == [b"tag", b"x" * (64 * 1024)]
                assert pull.socket.getsockopt(zmq.MAXMSGSIZE) == 64 * 1024
            finally:
                raw.close(linger=0)
