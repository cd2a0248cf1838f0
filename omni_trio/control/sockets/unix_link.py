"""The same-host link: Unix stream sockets driven by trio, without ZMQ's I/O threads.

Between processes of one host, a message crossed four threads under ZMQ (the sender's thread, its
ZMQ I/O thread, the receiver's I/O thread, the receiver's thread): three wake-ups per hop, which on
a machine with few cores cost more CPU than everything else a hop does (``benchmarks/link_floor.py``,
a three-process ring on 2 cores: ~500 µs and ~250 µs of CPU per process per round over pyzmq,
~230 µs and ~110 µs over this link). Here the sender writes into the socket and the kernel wakes
the receiver's trio loop: one wake-up. ZMQ stays for ``tcp://`` (CURVE, heartbeats, the joins of
workers on other hosts).

It offers what :class:`~omni_trio.control.sockets.zmq_trio.TrioSocket` offers the endpoint, with the same
policy (:class:`~omni_trio.control.sockets.zmq_trio.SocketPolicy`: every message sealed and checked, the
size cap) and the same semantics where the runtime relies on them. This module is the sending side,
:class:`UnixPush`; the receiving side, a process's inbox, is
:class:`~omni_trio.control.sockets.unix_inbox.UnixPull`, and the wire format between them
:mod:`omni_trio.control.sockets.framing`.

:class:`UnixPush` sends to one peer's inbox. Any number of tasks may send; each message is written
whole (a partly written one is finished, shielded, before the next). A full socket buffer makes
senders wait, as a PUSH socket waits at its high-water mark. Within a
:func:`~omni_trio.control.sockets.write_batch.holding` block, the holdable messages of the task that
opened it are written together when the batch is flushed. A message over the policy's
``max_message_bytes`` raises MessageTooLarge at the sender.

Where ZMQ would queue a message for a peer that is not listening (a worker that died and has not
been restarted), the link drops it and counts it (:attr:`UnixPush.undeliverable`); the next send
connects again, to the next incarnation if one is bound by then. Messages for a dead incarnation
are moot: its requests failed with it.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Sequence

import trio

from omni_trio.control.sockets import write_batch
from omni_trio.control.sockets.framing import frame_view, message_head
from omni_trio.control.sockets.turns import SendTurns
from omni_trio.control.sockets.zmq_sockets import IpcPath, ipc_endpoint
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire.auth import Frame
from omni_trio.errors import MessageTooLarge
from omni_trio.tracing.trace import get_logger

__all__ = ["UnixPush"]

log = get_logger(__name__)

#: Most buffers one ``sendmsg`` takes (the kernel refuses more than IOV_MAX, 1024 on Linux).
_MOST_BUFFERS = 512
#: The peer is not there (no socket file, nobody listening, the connection broke).
_ABSENT = (errno.ENOENT, errno.ECONNREFUSED, errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


class _OffLoopConnect:
    """A blocking connect on a worker thread, which a cancelled sender may leave behind: the socket
    is closed exactly once, by the cancel if the connect never started or is over, else by the
    thread when its connect returns; the sender's task is free at once (a peer that never accepts
    holds only that thread)."""

    def __init__(self, sock: socket.socket, path: str) -> None:
        self._sock = sock
        self._path = path
        self._lock = threading.Lock()
        self._started = False
        self._over = False
        self._abandoned = False

    async def wait(self) -> None:
        """Connect; raises what the connect raised, or Cancelled (the socket closed, now or by the thread)."""
        try:
            await trio.to_thread.run_sync(self._connect, abandon_on_cancel=True)
        except trio.Cancelled:
            # Also before the thread ran: to_thread checks for a cancel before it starts one.
            with self._lock:
                self._abandoned = True
                close = self._over or not self._started
            if close:
                self._sock.close()
            raise

    def _connect(self) -> None:
        with self._lock:
            if self._abandoned:
                return  # the cancel came first and closed the socket
            self._started = True
        try:
            self._sock.connect(self._path)
        finally:
            with self._lock:
                self._over = True
                close = self._abandoned
            if close:
                self._sock.close()


class UnixPush:
    """Sends to the :class:`~omni_trio.control.sockets.unix_inbox.UnixPull` bound at ``path`` (see the
    module docstring); connects at the first send, and again after the peer went away."""

    def __init__(self, path: IpcPath, policy: SocketPolicy) -> None:
        self._path = ipc_endpoint(path)[1]
        self._auth = policy.auth
        self._max_bytes = policy.max_message_bytes
        self._closed = False
        self._closing = False  # the process is shutting down: drops are expected, not warnings
        self._peer_closed = False  # the last connect found no socket file: the peer closed its inbox
        self._sock: socket.socket | None = None
        self._turns = SendTurns()
        #: Messages dropped because nobody listened at the path.
        self.undeliverable = 0

    @property
    def source(self) -> str:
        """The path of the peer's inbox."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the link was closed")

    async def send_multipart(self, frames: Sequence[Frame], *, urgent: bool = False) -> None:
        """Send one message, whole; waits (without polling) while the peer's socket buffer is full.

        An ``urgent`` message goes before the messages other tasks wait to send
        (:class:`~omni_trio.control.sockets.turns.SendTurns`). Cancel-safe: the message is either
        sent whole or not at all. A frame over the policy's ``max_message_bytes`` raises
        MessageTooLarge (nothing sent); a peer that is not listening loses the message (counted,
        see the module docstring). Raises trio.ClosedResourceError once closed.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        views = [frame_view(frame) for frame in self._auth.seal(frames)]
        sizes = [view.nbytes for view in views]
        if sum(sizes) > self._max_bytes:
            raise MessageTooLarge(sum(sizes), self._max_bytes)
        buffers: list[memoryview] = [memoryview(message_head(sizes)), *views]
        batch = write_batch.current()
        if batch is not None and not urgent and batch.mine():
            if write_batch.may_hold() and all(isinstance(frame, bytes) for frame in frames):
                batch.hold(self, self._write_held, buffers)
                return
            buffers = [*batch.take(self), *buffers]  # what was held for this peer goes first
        await self._send(buffers, urgent=urgent)

    async def _send(self, buffers: list[memoryview], *, urgent: bool = False) -> None:
        """Write ``buffers`` (whole framed messages) in this link's turn."""
        if self._turns.busy():
            await self._turns.take(urgent=urgent)
            try:
                await self._write(buffers)
            finally:
                self._turns.release()
            return
        self._turns.take_nowait()
        try:
            yielded = await self._write(buffers)
        finally:
            self._turns.release()
        if not yielded:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _write_held(self, buffers: list[memoryview]) -> None:
        """Write the messages a :class:`~omni_trio.control.sockets.write_batch.WriteBatch` held; none once
        the link is closed (as a send after the close would be refused)."""
        if not self._closed:
            await self._send(buffers)

    async def _write(self, buffers: list[memoryview]) -> bool:
        """Write one framed message (caller holds the lock); whether it yielded to the scheduler.

        A connection whose peer has gone (it died; a restart may have bound a next incarnation at
        the path since) is replaced once, and the message goes to whoever listens now.
        """
        yielded = False
        for _ in range(2):
            if self._sock is None:
                yielded |= await self._connect()
                if self._sock is None:
                    break
            try:
                return await self._write_to(self._sock, buffers) or yielded
            except OSError as exc:
                if exc.errno not in _ABSENT:
                    raise
                self._disconnect()
        self._undeliverable()
        return yielded

    async def _write_to(self, sock: socket.socket, buffers: list[memoryview]) -> bool:
        yielded = False
        sent_any = False
        while buffers:
            try:
                sent = sock.sendmsg(buffers[:_MOST_BUFFERS], (), socket.MSG_NOSIGNAL)
            except BlockingIOError:
                yielded = True
                if sent_any:
                    # Half a message is in the stream: the rest must follow, whatever is cancelled.
                    with trio.CancelScope(shield=True):
                        await trio.lowlevel.wait_writable(sock)
                else:
                    await trio.lowlevel.wait_writable(sock)
                self._check_open()
                continue
            sent_any = True
            buffers = _after(buffers, sent)
        return yielded

    async def _connect(self) -> bool:
        """Connect to whoever listens at the path (leaves ``_sock`` None if nobody); whether it yielded."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            try:
                sock.connect(self._path)
                yielded = False
            except BlockingIOError:
                # The listener's backlog is full (a Unix socket does not complete such a connect
                # later): wait for room in a blocking connect, off the loop.
                sock.setblocking(True)
                await _OffLoopConnect(sock, self._path).wait()
                sock.setblocking(False)
                yielded = True
        except OSError as exc:
            sock.close()
            if exc.errno in _ABSENT:
                self._peer_closed = exc.errno == errno.ENOENT
                return False
            raise
        except trio.Cancelled:
            raise  # _OffLoopConnect closes the socket (now, or its thread later)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return yielded

    def begin_closing(self) -> None:
        """The process is shutting down: a message nobody takes is logged at debug level from now on."""
        self._closing = True

    def _undeliverable(self) -> None:
        self.undeliverable += 1
        count = self.undeliverable
        if count & (count - 1) == 0:
            # A peer that removed its socket file closed its inbox on purpose (it shut down, as every
            # process does when the run closes): expected. One that left it behind died.
            expected = self._closing or self._peer_closed
            report = log.debug if expected else log.warning
            reason = "its inbox is closed (it shut down)" if self._peer_closed else "nobody listens there"
            report("message_undeliverable", socket=self._path, reason=reason, dropped=count)

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(RuntimeError):
                trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Close the link (what the kernel holds already still reaches the peer). Idempotent."""
        self._closed = True
        self._disconnect()


def _after(buffers: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of ``buffers`` once ``sent`` bytes of them were written."""
    for index, buffer in enumerate(buffers):
        if sent < buffer.nbytes:
            return [buffer[sent:], *buffers[index + 1 :]]
        sent -= buffer.nbytes
    return []
