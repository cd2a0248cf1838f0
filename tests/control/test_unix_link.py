"""The same-host link: whole messages in order, back-pressure, cancel-safety, refusals, peers that go
(and an endpoint's count of what it could not deliver)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from omni_trio.control.endpoint import Endpoint
from omni_trio.control.sockets.framing import MAX_FRAMES, message_head
from omni_trio.control.sockets.host import HostSockets
from omni_trio.control.sockets.unix_inbox import UnixPull
from omni_trio.control.sockets.unix_link import UnixPush, _OffLoopConnect
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import FrameMac, new_secret
from omni_trio.errors import MessageTooLarge
from omni_trio.tracing.trace import Tracer

#: The sockets of a run, as the runtime builds them: every message sealed and checked.
POLICY = SocketPolicy(FrameMac(new_secret()), 1 << 20)


@pytest.fixture
def inbox_path() -> Iterator[str]:
    """Where an inbox binds, in a short private directory (pytest's tmp_path can be too long)."""
    directory = tempfile.mkdtemp(prefix="ot-link-", dir="/tmp")
    os.chmod(directory, 0o700)
    yield os.path.join(directory, "inbox.sock")
    shutil.rmtree(directory, ignore_errors=True)


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


async def test_round_trip_of_frames_of_every_kind(inbox_path: str) -> None:
    with trio.fail_after(10), UnixPull(inbox_path, POLICY) as pull:
        assert stat.S_IMODE(os.stat(inbox_path).st_mode) == 0o600
        push = UnixPush(inbox_path, POLICY)
        await push.send_multipart([b"tag", b"body", b""])
        assert await pull.recv_multipart() == [b"tag", b"body", b""]
        async with trio.open_nursery() as nursery:  # more than the socket buffer: sent while received
            nursery.start_soon(push.send_multipart, [bytearray(b"x" * 600_000), memoryview(b"y")])
            assert await pull.recv_multipart() == [b"x" * 600_000, b"y"]
        assert pull.recv_nowait() is None
        push.close()


async def test_each_senders_messages_arrive_whole_and_in_order(inbox_path: str) -> None:
    senders, count = 4, 300
    with trio.fail_after(20), UnixPull(inbox_path, POLICY) as pull:
        pushes = [UnixPush(inbox_path, POLICY) for _ in range(senders)]

        async def send(index: int) -> None:
            for n in range(count):
                # Two tasks share each link: a message is never interleaved with another's bytes.
                await pushes[index // 2].send_multipart([f"{index}".encode(), n.to_bytes(4, "little"), b"z" * 5000])

        async with trio.open_nursery() as nursery:
            for index in range(senders * 2):
                nursery.start_soon(send, index)
            seen: dict[int, list[int]] = {index: [] for index in range(senders * 2)}
            for _ in range(senders * 2 * count):
                tag, n, body = await pull.recv_multipart()
                assert body == b"z" * 5000
                seen[int(tag)].append(int.from_bytes(n, "little"))
        assert all(numbers == list(range(count)) for numbers in seen.values())
        for push in pushes:
            push.close()


async def test_a_full_peer_makes_the_sender_wait_and_a_cancelled_send_loses_nothing_else(inbox_path: str) -> None:
    with trio.fail_after(20), UnixPull(inbox_path, POLICY) as pull:
        push = UnixPush(inbox_path, POLICY)
        sent = 0
        sending = trio.CancelScope()
        received: list[int] = []

        async def send_until_cancelled() -> None:
            nonlocal sent
            with sending:
                while True:
                    await push.send_multipart([b"m", sent.to_bytes(4, "little"), b"p" * 100_000])
                    sent += 1
            await push.send_multipart([b"m", b"last", b""])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_until_cancelled)
            await trio.testing.wait_all_tasks_blocked()  # nobody reads: the sender waits in a send
            assert sent > 0
            sending.cancel()  # that send, half written or not started, is cancelled
            while (frames := await pull.recv_multipart())[1] != b"last":
                received.append(int.from_bytes(frames[1], "little"))
        # The cancelled message was sent whole or not at all; each earlier one arrived, whole and once.
        assert received in (list(range(sent)), list(range(sent + 1)))
        push.close()


async def test_an_urgent_message_goes_before_the_messages_waiting_to_be_sent(inbox_path: str) -> None:
    # Ten thousand submits queued on a full link must not hold an abort back: it is written next.
    with trio.fail_after(20), UnixPull(inbox_path, POLICY) as pull:
        push = UnixPush(inbox_path, POLICY)
        bulky = b"p" * 600_000  # more than the socket buffer holds
        async with trio.open_nursery() as nursery:
            nursery.start_soon(push.send_multipart, [b"first", bulky])
            await trio.testing.wait_all_tasks_blocked()  # the link is full: the first send waits in its write
            for n in range(5):  # five senders wait for their turn, one after the other
                nursery.start_soon(push.send_multipart, [f"queued {n}".encode(), bulky])
                await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(functools.partial(push.send_multipart, [b"abort", b""], urgent=True))
            await trio.testing.wait_all_tasks_blocked()
            order = [(await pull.recv_multipart())[0] for _ in range(7)]
        # What was written in part finishes first (the stream needs it whole); then the urgent one.
        assert order[0] == b"first" and order[1] == b"abort"
        assert order[2:] == [f"queued {n}".encode() for n in range(5)]  # the others keep their order
        push.close()


async def test_the_sender_refuses_a_message_over_the_cap(inbox_path: str) -> None:
    with trio.fail_after(10), UnixPull(inbox_path, POLICY) as pull:
        push = UnixPush(inbox_path, POLICY)
        with pytest.raises(MessageTooLarge):
            await push.send_multipart([b"tag", b"x" * ((1 << 20) + 1)])
        with pytest.raises(MessageTooLarge):  # the frames together count, not each alone
            await push.send_multipart([b"x" * (1 << 19), b"y" * (1 << 19)])
        await push.send_multipart([b"still", b"fine"])
        assert await pull.recv_multipart() == [b"still", b"fine"]
        push.close()


@pytest.mark.parametrize(
    "head",
    [
        message_head([10, (1 << 20) + 1]),  # a frame over the cap, refused before its bytes arrive
        message_head([1 << 19] * 3),  # frames over the cap together
        message_head([1] * (MAX_FRAMES + 1)),  # too many frames
        b"\x02\x00\x00\x00\x07\x00\x00\x00",  # a header that is not ours
    ],
    ids=["frame-over-cap", "message-over-cap", "too-many-frames", "bad-header"],
)
async def test_a_stream_that_breaks_the_format_is_disconnected_and_counted(inbox_path: str, head: bytes) -> None:
    with trio.fail_after(10), UnixPull(inbox_path, POLICY) as pull:
        hostile = _raw(inbox_path)
        hostile.sendall(head)
        push = UnixPush(inbox_path, POLICY)
        await push.send_multipart([b"ok"])
        assert await pull.recv_multipart() == [b"ok"]  # the others are served meanwhile
        await trio.lowlevel.wait_readable(hostile)
        assert hostile.recv(1) == b""  # disconnected
        assert pull.refused_streams == 1
        hostile.close()
        push.close()


async def test_a_message_without_the_runs_proof_is_refused(inbox_path: str) -> None:
    policy = SocketPolicy(FrameMac(new_secret()), 1 << 20)
    with trio.fail_after(10), UnixPull(inbox_path, policy) as pull:
        forged = _raw(inbox_path)
        forged.sendall(message_head([3, 16]) + b"tag" + b"\0" * 16)
        push = UnixPush(inbox_path, policy)
        await push.send_multipart([b"genuine"])
        assert await pull.recv_multipart() == [b"genuine"]
        assert policy.auth.refused == 1
        forged.close()
        push.close()


async def test_nobody_listening_drops_the_message_and_a_next_incarnation_gets_the_next(inbox_path: str) -> None:
    with trio.fail_after(10):
        push = UnixPush(inbox_path, POLICY)
        await push.send_multipart([b"to nobody"])  # no socket file yet
        assert push.undeliverable == 1
        with UnixPull(inbox_path, POLICY) as first:
            await push.send_multipart([b"one"])
            assert await first.recv_multipart() == [b"one"]
        assert not os.path.exists(inbox_path)  # closing removes the socket file
        await push.send_multipart([b"to the dead one"])
        assert push.undeliverable == 2
        with UnixPull(inbox_path, POLICY) as second:  # a restart binds the same path
            await push.send_multipart([b"two"])
            assert await second.recv_multipart() == [b"two"]
        push.close()


async def test_a_send_to_a_peer_that_never_accepts_can_be_cancelled_and_leaks_no_socket(inbox_path: str) -> None:
    # A listener whose backlog is full (its process is stuck): the connect waits on a thread; the
    # sender's cancel scope frees the sender at once, and the socket is closed once the connect ends.
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(inbox_path)
    stuck.listen(0)
    stuck.settimeout(5)  # the test's bound on the accepts below
    queued: list[socket.socket] = []
    with contextlib.suppress(BlockingIOError):  # until the backlog is full
        while True:
            waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            waiting.setblocking(False)
            queued.append(waiting)
            waiting.connect(inbox_path)
    push = UnixPush(inbox_path, POLICY)
    try:
        with trio.fail_after(10):
            with trio.move_on_after(0.2) as sending:
                await push.send_multipart([b"for a stuck peer"])
            assert sending.cancelled_caught
            # The peer comes unstuck: its queued connection, then the abandoned connect's, which
            # the connect's thread closed, unsent.
            earlier = [stuck.accept()[0] for _ in queued[:-1]]
            abandoned, _ = stuck.accept()
            abandoned.settimeout(5)
            assert abandoned.recv(1) == b""
            for sock in [*earlier, abandoned]:
                sock.close()
    finally:
        push.close()
        for sock in queued:
            sock.close()
        stuck.close()


async def test_a_connect_cancelled_before_its_thread_started_closes_the_socket(inbox_path: str) -> None:
    # to_thread looks for a cancel before it starts the thread: then nobody but the cancel can close it.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            scope.cancel()
            await _OffLoopConnect(sock, inbox_path).wait()
    assert scope.cancelled_caught
    assert sock.fileno() == -1  # closed


async def test_a_restart_binds_over_a_dead_processes_file_which_that_process_then_leaves_alone(
    inbox_path: str,
) -> None:
    with trio.fail_after(10):
        old = UnixPull(inbox_path, POLICY)  # "dies" without closing: its file stays
        push = UnixPush(inbox_path, POLICY)
        await push.send_multipart([b"old"])
        assert await old.recv_multipart() == [b"old"]
        with UnixPull(inbox_path, POLICY) as new:
            old.close()  # the old process's late cleanup must not remove the new one's file
            assert os.path.exists(inbox_path)
            await push.send_multipart([b"new"])  # the old connection broke: the link reconnects
            assert await new.recv_multipart() == [b"new"]
        push.close()


async def test_close_wakes_a_pending_receive_and_later_operations_fail(inbox_path: str) -> None:
    pull = UnixPull(inbox_path, POLICY)
    push = UnixPush(inbox_path, POLICY)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def receive() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await pull.recv_multipart()

            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            pull.close()
        with pytest.raises(trio.ClosedResourceError):
            pull.recv_nowait()
        push.close()
        with pytest.raises(trio.ClosedResourceError):
            await push.send_multipart([b"x"])


def _dead_peer(path: str) -> socket.socket:
    """A socket file nobody listens at, as a process that died leaves it (connects are refused)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    return sock


async def test_a_drop_warns_for_a_dead_peer_but_not_once_closing_began_on_links_old_and_new(
    inbox_path: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A worker told to shut down still sends to peers that exited first: expected then, so quiet; a
    link it opens after that moment is as quiet as the ones it had. Before, a dead peer is warned of."""
    sockets = HostSockets(Path(inbox_path).parent, POLICY)
    peers: list[socket.socket] = []
    try:
        with trio.fail_after(10):
            warned = sockets.connect_local("dead")
            peers.append(_dead_peer(warned.source))
            await warned.send_multipart([b"lost"])
            assert "message_undeliverable" in capfd.readouterr().err
            before = sockets.connect_local("dead_a")
            sockets.begin_closing()
            after = sockets.connect_local("dead_b")
            peers += [_dead_peer(before.source), _dead_peer(after.source)]
            await before.send_multipart([b"late"])
            await after.send_multipart([b"late"])
        assert sockets.undeliverable == 3
        assert "message_undeliverable" not in capfd.readouterr().err
    finally:
        for peer in peers:
            peer.close()
        sockets.close()


async def test_a_drop_to_a_peer_that_closed_its_inbox_is_no_warning(
    inbox_path: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """A peer that shut down removed its socket file: what is still sent to it is expected to be lost."""
    with trio.fail_after(10):
        with UnixPull(inbox_path, POLICY):
            push = UnixPush(inbox_path, POLICY)
            await push.send_multipart([b"first"])
        await push.send_multipart([b"after it shut down"])  # the connection broke, the file is gone
        await push.send_multipart([b"and again"])
    assert push.undeliverable >= 1
    assert "message_undeliverable" not in capfd.readouterr().err
    push.close()


async def test_an_endpoint_counts_what_it_could_not_deliver_and_reaches_a_restarted_peer() -> None:
    directory = Path(tempfile.mkdtemp(prefix="ot-link-", dir="/tmp"))
    secret = new_secret()

    def endpoint(process: str) -> Endpoint:
        policy = SocketPolicy(FrameMac(secret, process=process), 1 << 20)
        return Endpoint(process=process, sockets=HostSockets(directory, policy), placement={"s": "p_b"},
                        shm_prefix=f"ot-link-{process}", tracer=Tracer(None, process))

    arrived: list[m.StatsRequest] = []
    arrival = trio.Event()

    async def on_stats(message: m.StatsRequest) -> None:
        arrived.append(message)
        arrival.set()

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                main = endpoint("main")
                await nursery.start(main.serve)
                await main.send("p_b", m.StatsRequest(reply_to="main", token=1))  # p_b is not there (yet)
                assert main.undeliverable == 1
                for token in (2, 3):  # the worker, then its restart (a new endpoint at the same path)
                    worker = endpoint("p_b")
                    worker.on(m.StatsRequest, on_stats)
                    await nursery.start(worker.serve)
                    arrival = trio.Event()
                    await main.send("p_b", m.StatsRequest(reply_to="main", token=token))
                    await arrival.wait()
                    worker.stop()
                    await trio.testing.wait_all_tasks_blocked()
                assert [message.token for message in arrived] == [2, 3] and main.undeliverable == 1
                main.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
