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
size cap) and the same semantics where the runtime relies on them:

- :class:`UnixPull` is a process's inbox, bound at a path: any number of peers connect; messages of
  one peer arrive in order, whole; one owning task receives (:meth:`UnixPull.recv_multipart`,
  :meth:`UnixPull.recv_nowait`). It watches its listener and all its connections through one epoll
  descriptor, so one task serves them all with no task per connection.
- :class:`UnixPush` sends to one peer's inbox. Any number of tasks may send; each message is
  written whole (a partly written one is finished, shielded, before the next). A full socket buffer
  makes senders wait, as a PUSH socket waits at its high-water mark.

Wire format, per message: ``<II`` (frame count, 0) then one ``<I`` length per frame, then the
frames. A message's frames together, its proof included, may hold the policy's ``max_message_bytes``
(the sender raises MessageTooLarge for more). A peer that breaks the format (more than
:data:`MAX_FRAMES` frames, more bytes than that) is disconnected before any of its frame bytes are
kept, and counted in :attr:`UnixPull.refused_streams`; a message without the run's proof is
counted and dropped by the authenticator, as on every socket.

Where ZMQ would queue a message for a peer that is not listening (a worker that died and has not
been restarted), the link drops it and counts it (:attr:`UnixPush.undeliverable`); the next send
connects again, to the next incarnation if one is bound by then. Messages for a dead incarnation
are moot: its requests failed with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import threading
from collections import deque
from collections.abc import Sequence
from types import TracebackType

import trio

from omni_trio.control.sockets.zmq_sockets import IpcPath, ipc_endpoint
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire.auth import Frame
from omni_trio.errors import MessageTooLarge
from omni_trio.tracing.trace import get_logger

__all__ = ["MAX_FRAMES", "UnixPull", "UnixPush", "message_head"]

log = get_logger(__name__)

#: Most frames one message may have (a peer sending more is disconnected).
MAX_FRAMES = 4096
_HEAD = struct.Struct("<II")
_LENGTH = struct.Struct("<I")
#: Bytes read from a connection per call (into the inbox's one reused buffer: a fresh buffer this big
#: per read is above malloc's mmap threshold, so each message cost an mmap, mremap and munmap and a
#: page fault in every receiving process).
_READ = 1 << 18
#: The peer is not there (no socket file, nobody listening, the connection broke).
_ABSENT = (errno.ENOENT, errno.ECONNREFUSED, errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


def message_head(sizes: Sequence[int]) -> bytes:
    """What precedes a message of frames of these ``sizes`` on the wire (see the module docstring)."""
    return _HEAD.pack(len(sizes), 0) + struct.pack(f"<{len(sizes)}I", *sizes)


def _fs_path(path: IpcPath) -> str:
    return ipc_endpoint(path)[1]


def _frame_view(frame: Frame) -> memoryview:
    return memoryview(frame.buffer if not isinstance(frame, bytes | bytearray | memoryview) else frame).cast("B")


class _Connection:
    """One peer's stream into a :class:`UnixPull`: what arrived and is not yet a whole message."""

    __slots__ = ("buffer", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()


class _End:
    """What both ends of the link share: the path, the run's policy, whether it is closed."""

    def __init__(self, path: IpcPath, policy: SocketPolicy, what: str) -> None:
        self._path = _fs_path(path)
        self._auth = policy.auth
        self._max_bytes = policy.max_message_bytes
        self._closed = False
        self._what = what

    @property
    def source(self) -> str:
        """The path of the inbox (this one, or the peer's this end sends to)."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError(f"the {self._what} was closed")


class UnixPull(_End):
    """A process's inbox on this host (see the module docstring); bound at once, at ``path``."""

    def __init__(self, path: IpcPath, policy: SocketPolicy) -> None:
        super().__init__(path, policy, "inbox")
        self._messages: deque[list[bytes]] = deque()
        self._connections: dict[int, _Connection] = {}
        self._scratch = memoryview(bytearray(_READ))
        #: Peers disconnected for breaking the wire format.
        self.refused_streams = 0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a socket file left by a process that died (its restart binds here)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.setblocking(False)
            self._listener.bind(self._path)
            # Only our user may connect (one more line of defence besides the run's proofs).
            os.chmod(self._path, 0o600)
            self._inode = os.stat(self._path).st_ino
            self._listener.listen(socket.SOMAXCONN)
            self._epoll = select.epoll()
        except BaseException:
            self._listener.close()
            raise
        self._listener_fd = self._listener.fileno()
        self._epoll.register(self._listener_fd, select.EPOLLIN)

    async def recv_multipart(self) -> list[bytes]:
        """Receive one message (its frames, the proof checked and removed).

        Cancel-safe: a message is either returned or kept for the next call. Raises
        trio.ClosedResourceError if the inbox is or gets closed.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self.recv_nowait()
        if message is not None:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return message
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            message = self.recv_nowait()
            if message is not None:
                return message

    def recv_nowait(self) -> list[bytes] | None:
        """One message already here or readable now, else None (never waits)."""
        self._check_open()
        while True:
            if not self._messages and not self._fill():
                return None
            opened = self._auth.open(self._messages.popleft(), self._path)
            if opened is not None:
                return opened

    def _fill(self) -> bool:
        """Read what is readable now into whole messages; whether any message is queued."""
        for fd, _ in self._epoll.poll(0):
            if fd == self._listener_fd:
                self._accept()
            else:
                self._read(self._connections[fd])
        return bool(self._messages)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            self._connections[sock.fileno()] = _Connection(sock)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _read(self, connection: _Connection) -> None:
        try:
            size = connection.sock.recv_into(self._scratch)
        except BlockingIOError:
            return
        except OSError:
            size = 0
        if not size:
            self._drop(connection)
            return
        connection.buffer += self._scratch[:size]
        reason = self._split(connection.buffer)
        if reason is not None:
            self.refused_streams += 1
            log.warning("stream_refused", socket=self._path, reason=reason, refused=self.refused_streams)
            self._drop(connection)

    def _split(self, buffer: bytearray) -> str | None:
        """Move the whole messages at the start of ``buffer`` to the queue; why the stream is refused, if it is."""
        at = 0
        end = len(buffer)
        view = memoryview(buffer)
        try:
            while end - at >= _HEAD.size:
                count, reserved = _HEAD.unpack_from(buffer, at)
                if count > MAX_FRAMES or reserved:
                    return f"a message of {count} frames (at most {MAX_FRAMES})" if count > MAX_FRAMES else "bad header"
                lengths_at = at + _HEAD.size
                if end - lengths_at < count * _LENGTH.size:
                    break
                lengths = struct.unpack_from(f"<{count}I", buffer, lengths_at)
                size = sum(lengths)
                if size > self._max_bytes:
                    return f"a message of {size} bytes (at most {self._max_bytes})"
                frame_at = lengths_at + count * _LENGTH.size
                if end - frame_at < size:
                    break
                frames = []
                for length in lengths:
                    frames.append(bytes(view[frame_at : frame_at + length]))
                    frame_at += length
                self._messages.append(frames)
                at = frame_at
        finally:
            view.release()
        del buffer[:at]
        return None

    def _drop(self, connection: _Connection) -> None:
        self._epoll.unregister(connection.sock.fileno())
        del self._connections[connection.sock.fileno()]
        connection.sock.close()

    def close(self) -> None:
        """Close the inbox (its connections and its socket file); pending and later receives raise
        ClosedResourceError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Must precede closing the fd: wakes a task waiting on it with ClosedResourceError.
        with contextlib.suppress(RuntimeError):  # outside trio.run nobody can be waiting
            trio.lowlevel.notify_closing(self._epoll.fileno())
        for connection in self._connections.values():
            connection.sock.close()
        self._connections.clear()
        self._epoll.close()
        self._listener.close()
        # Not the file of a next incarnation that bound the same path meanwhile.
        with contextlib.suppress(OSError):
            if os.stat(self._path).st_ino == self._inode:
                os.unlink(self._path)

    def __enter__(self) -> UnixPull:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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


class UnixPush(_End):
    """Sends to the :class:`UnixPull` bound at ``path`` (see the module docstring); connects at the
    first send, and again after the peer went away."""

    def __init__(self, path: IpcPath, policy: SocketPolicy) -> None:
        super().__init__(path, policy, "link")
        self._sock: socket.socket | None = None
        self._lock = trio.StrictFIFOLock()
        #: Messages dropped because nobody listened at the path.
        self.undeliverable = 0

    async def send_multipart(self, frames: Sequence[Frame]) -> None:
        """Send one message, whole; waits (without polling) while the peer's socket buffer is full.

        Cancel-safe: the message is either sent whole or not at all. A frame over the policy's
        ``max_message_bytes`` raises MessageTooLarge (nothing sent); a peer that is not listening
        loses the message (counted, see the module docstring). Raises trio.ClosedResourceError
        once closed.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        views = [_frame_view(frame) for frame in self._auth.seal(frames)]
        sizes = [view.nbytes for view in views]
        if sum(sizes) > self._max_bytes:
            raise MessageTooLarge(sum(sizes), self._max_bytes)
        buffers: list[memoryview] = [memoryview(message_head(sizes)), *views]
        if self._lock.locked():
            async with self._lock:
                await self._write(buffers)
            return
        self._lock.acquire_nowait()
        try:
            yielded = await self._write(buffers)
        finally:
            self._lock.release()
        if not yielded:
            await trio.lowlevel.cancel_shielded_checkpoint()

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
                sent = sock.sendmsg(buffers, (), socket.MSG_NOSIGNAL)
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
                return False
            raise
        except trio.Cancelled:
            raise  # _OffLoopConnect closes the socket (now, or its thread later)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return yielded

    def _undeliverable(self) -> None:
        self.undeliverable += 1
        count = self.undeliverable
        if count & (count - 1) == 0:
            log.warning("message_undeliverable", socket=self._path, reason="nobody listens there", dropped=count)

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
