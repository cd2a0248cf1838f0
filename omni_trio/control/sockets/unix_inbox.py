"""A process's inbox on this host: :class:`UnixPull`, the receiving end of the same-host link
(:mod:`omni_trio.control.sockets.unix_link` sends to it; :mod:`omni_trio.control.sockets.framing`
is the wire format).

Any number of peers connect; messages of one peer arrive in order, whole; one owning task receives
(:meth:`UnixPull.recv_multipart`, :meth:`UnixPull.recv_nowait`). It watches its listener and all its
connections through one epoll descriptor, so one task serves them all with no task per connection.

Every message is checked for the run's proof as soon as it is whole (a message without it is counted
by the authenticator and dropped). Whoever can reach the socket file can connect, so a connection
is *unproven* until its first message with the proof arrives, and the inbox keeps serving whatever
connections do (the policy's :class:`~omni_trio.control.sockets.limits.InboxLimits`):

- at most ``unproven_cap()`` unproven connections are held: a newer one evicts the oldest;
- a connection unproven after ``proof_timeout_s`` is closed, and so is one whose message, once
  begun, is not whole after ``message_timeout_s``;
- unfinished messages of all connections together hold at most ``max_unfinished_bytes``: past it,
  the unproven connections holding some are closed first, oldest first, then the one that crossed it;
- when ``accept`` finds no free descriptor (EMFILE, ENFILE), the inbox gives up a descriptor it keeps
  in reserve for the moment, accepts the waiting connection and closes it (the backlog is emptied,
  nothing crashes); should the reserve be lost, it stops accepting until one of its connections
  closes (an event, not a timer).

Each connection closed for these reasons is counted in :attr:`UnixPull.refused_connections`; a
stream that breaks the wire format in :attr:`UnixPull.refused_streams`. The deadlines need no task:
the receiving task's wait ends at the earliest one.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import socket
from collections import deque
from types import TracebackType

import trio

from omni_trio.comm.descriptors import NO_DESCRIPTOR, open_reserve
from omni_trio.control.sockets.framing import split_messages
from omni_trio.control.sockets.zmq_sockets import IpcPath, ipc_endpoint
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.tracing.trace import get_logger

__all__ = ["UnixPull"]

log = get_logger(__name__)

#: Bytes read from a connection per call (into the inbox's one reused buffer: a fresh buffer this big
#: per read is above malloc's mmap threshold, so each message cost an mmap, mremap and munmap and a
#: page fault in every receiving process).
_READ = 1 << 18


class _Connection:
    """One peer's stream into a :class:`UnixPull`: what arrived and is not yet a whole message, and
    its deadlines (trio time; None: none runs)."""

    __slots__ = ("buffer", "message_due", "proof_due", "sock")

    def __init__(self, sock: socket.socket, proof_due: float) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.proof_due: float | None = proof_due
        self.message_due: float | None = None

    def due(self) -> float:
        """The earliest of its deadlines (inf: none)."""
        return min(self.proof_due or math.inf, self.message_due or math.inf)


class UnixPull:
    """A process's inbox on this host (see the module docstring); bound at once, at ``path``."""

    def __init__(self, path: IpcPath, policy: SocketPolicy) -> None:
        self._path = ipc_endpoint(path)[1]
        self._auth = policy.auth
        self._max_bytes = policy.max_message_bytes
        self._limits = policy.limits
        self._unproven_cap = policy.limits.unproven_cap()
        self._closed = False
        self._messages: deque[list[bytes]] = deque()
        self._connections: dict[int, _Connection] = {}
        #: The connections not proven yet, oldest first.
        self._unproven: dict[int, _Connection] = {}
        #: The connections with a deadline running.
        self._timed: set[_Connection] = set()
        self._unfinished = 0
        self._scratch = memoryview(bytearray(_READ))
        #: Peers disconnected for breaking the wire format.
        self.refused_streams = 0
        #: Connections closed by the inbox's limits (see the module docstring).
        self.refused_connections = 0
        self._accepting = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a socket file left by a process that died (its restart binds here)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._reserve: int | None = None
        try:
            self._listener.setblocking(False)
            self._listener.bind(self._path)
            # Only our user may connect (one more line of defence besides the run's proofs).
            os.chmod(self._path, 0o600)
            self._inode = os.stat(self._path).st_ino
            self._listener.listen(socket.SOMAXCONN)
            self._epoll = select.epoll()
            self._reserve = open_reserve()
        except BaseException:
            self._listener.close()
            raise
        self._listener_fd = self._listener.fileno()
        self._epoll.register(self._listener_fd, select.EPOLLIN)

    @property
    def source(self) -> str:
        """The path of the inbox."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

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
            # The wait ends at the earliest deadline of a connection, which is then enforced.
            with trio.move_on_at(min((c.due() for c in self._timed), default=math.inf)):
                await trio.lowlevel.wait_readable(self._epoll.fileno())
            message = self.recv_nowait()
            if message is not None:
                return message

    def recv_nowait(self) -> list[bytes] | None:
        """One message already here or readable now, else None (never waits)."""
        if self._closed:
            raise trio.ClosedResourceError("the inbox was closed")
        if not self._messages:
            self._fill()
        return self._messages.popleft() if self._messages else None

    def _fill(self) -> None:
        """Read what is readable now into whole messages, then close the connections past a deadline."""
        for fd, _ in self._epoll.poll(0):
            if fd == self._listener_fd:
                self._accept()
            else:
                connection = self._connections.get(fd)
                if connection is not None:  # not closed by the limits in this round
                    self._read(connection)
        if self._timed:
            now = trio.current_time()
            for connection in [c for c in self._timed if c.due() <= now]:
                if connection.proof_due is not None and connection.proof_due <= now:
                    self._refuse(connection, f"no message with the run's proof in {self._limits.proof_timeout_s} s")
                else:
                    self._refuse(connection, f"a message unfinished after {self._limits.message_timeout_s} s")

    def _accept(self) -> None:
        while self._accepting:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                if exc.errno not in NO_DESCRIPTOR:
                    raise
                if self._refuse_waiting():
                    continue
                return
            if len(self._unproven) >= self._unproven_cap:
                oldest = next(iter(self._unproven.values()))
                self._refuse(oldest, f"{self._unproven_cap} unproven connections already (a newer one came)")
            sock.setblocking(False)
            connection = _Connection(sock, trio.current_time() + self._limits.proof_timeout_s)
            self._connections[sock.fileno()] = self._unproven[sock.fileno()] = connection
            self._timed.add(connection)
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _refuse_waiting(self) -> bool:
        """No descriptor is free: close the next waiting connection with the one in reserve; without one
        (or should it not help), stop accepting until a connection closes. Whether to accept on."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return False  # nobody waits (Linux's accept takes a descriptor before it looks)
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    return True
                if exc.errno not in NO_DESCRIPTOR:
                    raise
            else:
                sock.close()
                self._count_refused("no descriptor free")
                return True
            finally:
                self._reserve = open_reserve()
        self._epoll.unregister(self._listener_fd)
        self._accepting = False
        log.warning("inbox_paused", socket=self._path, reason="no descriptor free, none in reserve")
        return False

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
        buffer = connection.buffer
        before = len(buffer)
        buffer += self._scratch[:size]
        whole: list[list[bytes]] = []
        reason = split_messages(buffer, self._max_bytes, whole)
        for frames in whole:
            opened = self._auth.open(frames, self._path)
            if opened is not None:
                self._messages.append(opened)
                if connection.proof_due is not None:
                    connection.proof_due = None
                    del self._unproven[connection.sock.fileno()]
        self._unfinished += len(buffer) - before
        if reason is not None:
            self.refused_streams += 1
            log.warning("stream_refused", socket=self._path, reason=reason, refused=self.refused_streams)
            self._drop(connection)
            return
        if not buffer:
            connection.message_due = None
        elif whole or connection.message_due is None:
            connection.message_due = trio.current_time() + self._limits.message_timeout_s
        if connection.due() == math.inf:
            self._timed.discard(connection)
        else:
            self._timed.add(connection)
        if self._unfinished > self._limits.max_unfinished_bytes:
            self._make_room(connection)

    def _make_room(self, reader: _Connection) -> None:
        """Unfinished messages hold more than the cap: close the unproven connections holding some, oldest
        first (a newcomer amid a flood is a peer's likelier than one that had time to prove itself and
        did not), then ``reader``, until they fit."""
        reason = f"unfinished messages over {self._limits.max_unfinished_bytes} bytes"
        for hoarder in [c for c in self._unproven.values() if c.buffer]:
            if self._unfinished <= self._limits.max_unfinished_bytes:
                return
            self._refuse(hoarder, reason)
        if self._unfinished > self._limits.max_unfinished_bytes and reader.sock.fileno() >= 0:  # not closed above
            self._refuse(reader, reason)

    def _refuse(self, connection: _Connection, reason: str) -> None:
        self._drop(connection)
        self._count_refused(reason)

    def _count_refused(self, reason: str) -> None:
        self.refused_connections += 1
        count = self.refused_connections
        if count & (count - 1) == 0:
            log.warning("connection_refused", socket=self._path, reason=reason, refused=count)

    def _drop(self, connection: _Connection) -> None:
        fd = connection.sock.fileno()
        self._epoll.unregister(fd)
        del self._connections[fd]
        self._unproven.pop(fd, None)
        self._timed.discard(connection)
        self._unfinished -= len(connection.buffer)
        connection.sock.close()
        if not self._accepting:
            # A descriptor is free again: accept again (what waits in the backlog is readable at once).
            if self._reserve is None:
                self._reserve = open_reserve()
            self._accepting = True
            self._epoll.register(self._listener_fd, select.EPOLLIN)

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
        self._unproven.clear()
        self._timed.clear()
        self._epoll.close()
        self._listener.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
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
