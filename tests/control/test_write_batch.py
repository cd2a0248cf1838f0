"""Held writes: the holdable messages one task sends inside ``write_batch.holding()`` reach a same-host
peer only when the batch is flushed, each peer's in one write, in the order they were sent; urgent
messages, messages not marked holdable, messages of other tasks and messages framing borrowed memory
are never held back, and go after what was held for their peer. In a pipeline, a drain that waits for
a shared-memory credit while it holds messages is not stuck (the test that found it:
tests/reliability/test_backpressure_credits.py)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest
import trio

from omni_trio.control.sockets import write_batch
from omni_trio.control.sockets.unix_inbox import UnixPull
from omni_trio.control.sockets.unix_link import UnixPush
from tests.control.test_unix_link import POLICY


@pytest.fixture
def inbox_paths() -> Iterator[tuple[str, str]]:
    """Where two inboxes bind, in a short private directory."""
    directory = tempfile.mkdtemp(prefix="ot-batch-", dir="/tmp")
    os.chmod(directory, 0o700)
    yield os.path.join(directory, "a.sock"), os.path.join(directory, "b.sock")
    shutil.rmtree(directory, ignore_errors=True)


class CountingSocket(socket.socket):
    """A Unix socket that counts its ``sendmsg`` calls."""

    calls = 0

    def sendmsg(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        CountingSocket.calls += 1
        return super().sendmsg(*args, **kwargs)


async def test_a_task_s_messages_go_out_together_when_flushed(
    inbox_paths: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "socket", CountingSocket)
    path_a, path_b = inbox_paths
    with trio.fail_after(10), UnixPull(path_a, POLICY) as pull_a, UnixPull(path_b, POLICY) as pull_b:
        push_a, push_b = UnixPush(path_a, POLICY), UnixPush(path_b, POLICY)
        await push_a.send_multipart([b"connect"])
        await push_b.send_multipart([b"connect"])
        assert await pull_a.recv_multipart() == [b"connect"] and await pull_b.recv_multipart() == [b"connect"]
        CountingSocket.calls = 0
        with write_batch.holding() as held, write_batch.holdable():
            for n in range(10):
                await push_a.send_multipart([b"a", n.to_bytes(2, "little")])
                await push_b.send_multipart([b"b", n.to_bytes(2, "little")])
        await trio.sleep(0.05)
        assert pull_a.recv_nowait() is None and pull_b.recv_nowait() is None  # held
        assert CountingSocket.calls == 0
        await held.flush()
        for pull, tag in ((pull_a, b"a"), (pull_b, b"b")):
            assert [await pull.recv_multipart() for _ in range(10)] == [
                [tag, n.to_bytes(2, "little")] for n in range(10)
            ]
        assert CountingSocket.calls == 2  # one write per peer
        await push_a.send_multipart([b"after"])  # flushed: written at once again
        assert await pull_a.recv_multipart() == [b"after"]
        push_a.close()
        push_b.close()


async def test_what_is_never_held(inbox_paths: tuple[str, str]) -> None:
    path, _ = inbox_paths
    with trio.fail_after(10), UnixPull(path, POLICY) as pull:
        push = UnixPush(path, POLICY)
        with write_batch.holding() as held:
            with write_batch.holdable():
                await push.send_multipart([b"held 1"])
                await push.send_multipart([b"urgent"], urgent=True)
                assert await pull.recv_multipart() == [b"urgent"]
                async with trio.open_nursery() as nursery:  # another task: written at once
                    nursery.start_soon(push.send_multipart, [b"other task"])
                assert await pull.recv_multipart() == [b"other task"]
                # A view of memory its sender may reuse once the send returns: now, after what was held.
                await push.send_multipart([memoryview(bytearray(b"borrowed"))])
                assert [await pull.recv_multipart(), await pull.recv_multipart()] == [[b"held 1"], [b"borrowed"]]
                await push.send_multipart([b"held 2"])
            await push.send_multipart([b"not holdable"])  # now, after what was held
            assert [await pull.recv_multipart(), await pull.recv_multipart()] == [[b"held 2"], [b"not holdable"]]
        await held.flush()
        await trio.sleep(0.05)
        assert pull.recv_nowait() is None  # nothing was left to flush
        push.close()


async def test_a_closed_link_drops_what_it_held(inbox_paths: tuple[str, str]) -> None:
    path, _ = inbox_paths
    with trio.fail_after(10), UnixPull(path, POLICY) as pull:
        push = UnixPush(path, POLICY)
        with write_batch.holding() as held, write_batch.holdable():
            await push.send_multipart([b"held"])
        push.close()
        await held.flush()
        await trio.sleep(0.05)
        assert pull.recv_nowait() is None
