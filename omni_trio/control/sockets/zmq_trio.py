"""pyzmq sockets driven by trio, without polling.

A zmq socket exposes one file descriptor (``zmq.FD``) that becomes readable
when the socket's state *may* have changed (commands pending inside libzmq).
It is edge-like: reading ``zmq.EVENTS`` (or any send/recv) processes those
commands and resets the fd, possibly *making* the socket readable/writable
without the fd ever signalling again. So the only correct loop is:

1. try the operation with ``NOBLOCK``;
2. on ``zmq.Again`` read ``EVENTS``; if the wanted flag is set, retry;
3. only then ``await trio.lowlevel.wait_readable(fd)`` and go to 2.

Trio allows one task at a time in ``wait_readable`` for a given fd, while
both receiving (POLLIN) and sending (POLLOUT) wait on that same fd. One
waiting task per direction is admitted (a ``trio.Lock`` each); of those, the
first becomes the *watcher* that sits in ``wait_readable``; any other waiter
parks on an event and is woken whenever someone reads ``EVENTS`` and sees its
flag (including after every successful send/recv, which may have consumed the
fd's signal), and whenever the watcher leaves, so that it can take over.

Ownership rule: **one owning task per socket for receiving** (a second
concurrent receiver is serialised behind the receive lock, but message order
between two receivers is then arbitrary). Any number of tasks may send; each
``send_multipart`` is atomic (libzmq delivers multipart messages whole).

The runtime uses these sockets between hosts (``tcp://``); processes of one
host talk over :mod:`omni_trio.control.sockets.unix_link` instead, which spares each
hop ZMQ's I/O threads. It uses PUSH/PULL only: a PUSH socket blocks at its
high-water mark instead of dropping (aborts included, see
:mod:`omni_trio.control.aborts`), where a PUB socket would drop.
:mod:`omni_trio.control.sockets.zmq_sockets` makes a run's sockets (endpoints, options,
CURVE, heartbeats) and watches a connection for its drop.

Every socket of a run is built with the run's :class:`SocketPolicy`: its
:class:`~omni_trio.control.wire.auth.Authenticator` seals each message sent and
checks each message received before the caller sees it (a message without
valid proof is counted and skipped: ``recv_multipart`` never returns it), and
its ``max_message_bytes`` is the socket's ``ZMQ_MAXMSGSIZE`` (libzmq drops
the connection of a peer that sends a bigger frame, before buffering it) and
the limit of each frame sent (:class:`~omni_trio.errors.MessageTooLarge`
instead of a message the peer would refuse).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import attrs
import trio
import zmq

from omni_trio.control.sockets.limits import InboxLimits
from omni_trio.control.sockets.turns import SendTurns
from omni_trio.control.wire.auth import Authenticator, Frame
from omni_trio.control.wire.curve import Curve
from omni_trio.errors import MessageTooLarge

__all__ = [
    "SocketPolicy",
    "TrioSocket",
]

@attrs.frozen
class SocketPolicy:
    """What every socket of a run applies: the process's authenticator and the largest frame accepted;
    for ``tcp://`` sockets, the run's CURVE keys (None: the run has none, and refuses TCP); what an
    inbox lets the connections to it hold (``limits``)."""

    auth: Authenticator
    max_message_bytes: int
    curve: Curve | None = None
    limits: InboxLimits = attrs.field(factory=InboxLimits)


#: Send flags as ints (see :meth:`TrioSocket._send_now`).
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_LAST = int(zmq.NOBLOCK)


@attrs.define(eq=False)
class _Waiter:
    flag: int
    event: trio.Event = attrs.field(factory=trio.Event)
    scope: trio.CancelScope | None = None

    def wake(self) -> None:
        if self.scope is not None:
            self.scope.cancel()
        self.event.set()


class TrioSocket:
    """A zmq socket used from trio tasks (the zmq socket must not be used elsewhere).

    Receiving: one owning task (see module docstring). Sending: any task.
    ``close()`` wakes pending operations with ``trio.ClosedResourceError``.
    With a ``policy``, messages are sealed and checked (see the module
    docstring) and ``source`` names the socket in reports;
    without one (a bare socket, not one of a run) frames pass as they are.
    """

    def __init__(
        self, socket: zmq.Socket[Any], policy: SocketPolicy | None = None, *, source: str = ""
    ) -> None:
        self._sock = socket
        self._auth = None if policy is None else policy.auth
        self._opens = self._auth is not None
        self._max_frame = None if policy is None else policy.max_message_bytes
        self._source = source
        self._fd = int(socket.getsockopt(zmq.FD))
        self._closed = False
        self._recv_lock = trio.Lock()
        self._send_turns = SendTurns()
        self._waiters: dict[int, _Waiter] = {}
        self._watcher: _Waiter | None = None

    @property
    def socket(self) -> zmq.Socket[Any]:
        """The wrapped zmq socket (for setsockopt; do not send/recv on it directly)."""
        return self._sock

    @property
    def source(self) -> str:
        """Where the socket is bound or connected (a path, or the ``tcp://`` endpoint)."""
        return self._source

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("zmq socket was closed")

    def _poll_events(self, me: _Waiter | None = None) -> int:
        """Read EVENTS (which resets the fd) and wake waiters it satisfies."""
        events = int(self._sock.getsockopt(zmq.EVENTS))
        for waiter in self._waiters.values():
            if waiter is not me and events & waiter.flag:
                waiter.wake()
        return events

    def _after_op(self) -> None:
        # A successful send/recv may have processed the commands that would
        # have woken another waiter (and reset the fd): tell it.
        if self._waiters:
            self._poll_events()

    async def _wait(self, flag: int) -> None:
        """Return once ``EVENTS & flag``; caller holds that direction's lock."""
        me = _Waiter(flag)
        self._waiters[flag] = me
        try:
            while True:
                self._check_open()
                # Fresh event before polling: a wake-up after the poll below
                # is never lost, a stale one from earlier never spins us.
                me.event = trio.Event()
                if self._poll_events(me) & flag:
                    return
                if self._watcher is None:
                    self._watcher = me
                    try:
                        with trio.CancelScope() as scope:
                            me.scope = scope
                            await trio.lowlevel.wait_readable(self._fd)
                    finally:
                        me.scope = None
                        self._watcher = None
                else:
                    await me.event.wait()
        finally:
            del self._waiters[flag]
            # Hand the watch over: remaining waiters recheck, one takes it.
            for waiter in self._waiters.values():
                waiter.wake()

    def _opened(self, frames: list[bytes]) -> list[bytes] | None:
        if not self._opens:
            return frames
        assert self._auth is not None
        return self._auth.open(frames, self._source)

    async def recv_multipart(self) -> list[bytes]:
        """Receive one message (all its frames as bytes; with a policy, one with a valid proof, without it).

        Cancel-safe: a message is either returned or left in the socket (one
        refused is consumed). Raises trio.ClosedResourceError if the socket is
        or gets closed.
        """
        while True:
            opened = self._opened(await self._recv_raw())
            if opened is not None:
                return opened

    async def _recv_raw(self) -> list[bytes]:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        try:
            frames: list[bytes] = self._sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            pass
        else:
            self._after_op()
            # Yield once (trio convention) without risking the message.
            await trio.lowlevel.cancel_shielded_checkpoint()
            return frames
        async with self._recv_lock:
            while True:
                self._check_open()
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    await self._wait(zmq.POLLIN)
                    continue
                self._after_op()
                return frames

    def recv_nowait(self) -> list[bytes] | None:
        """Receive one message if one is queued, else return None (never waits).

        Lets the owning task take every queued message in one wake-up.
        """
        self._check_open()
        while True:
            try:
                frames: list[bytes] = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            self._after_op()
            opened = self._opened(frames)
            if opened is not None:
                return opened

    async def send_multipart(self, frames: Sequence[Frame], *, urgent: bool = False) -> None:
        """Send one message; waits (without polling) while the socket is at its HWM (an ``urgent``
        message before the others waiting; what zmq queued already goes first).

        Frames of 64 KiB and more are sent without copying (pyzmq's copy
        threshold): do not mutate their buffers afterwards. Cancel-safe: the
        message is either queued whole or not at all. With a policy, a frame
        over its ``max_message_bytes`` raises MessageTooLarge (nothing sent).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._max_frame is not None:
            for frame in frames:
                size = frame.nbytes if type(frame) is memoryview else len(frame)
                if size > self._max_frame:
                    raise MessageTooLarge(size, self._max_frame)
        if self._auth is not None:
            frames = self._auth.seal(frames)
        try:
            self._send_now(frames)
        except zmq.Again:
            pass
        else:
            self._after_op()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._send_turns.take(urgent=urgent)
        try:
            while True:
                self._check_open()
                try:
                    self._send_now(frames)
                except zmq.Again:
                    await self._wait(zmq.POLLOUT)
                    continue
                self._after_op()
                return
        finally:
            self._send_turns.release()

    def _send_now(self, frames: Sequence[Frame]) -> None:
        """``send_multipart(frames, NOBLOCK)``, with the flags as plain ints: pyzmq's own loop ORs
        its flag enums per frame, which costs more than the sends. Atomic as that is: zmq queues
        the later frames of a message whose first frame it took."""
        send = self._sock.send
        for frame in frames[:-1]:
            send(frame, _MORE)
        send(frames[-1], _LAST)

    def close(self, linger: int = 0) -> None:
        """Close the socket; pending and later operations raise ClosedResourceError.

        ``linger`` (ms) is passed to zmq: 0 drops unsent messages now; a
        positive value lets ``Context.term()`` try to deliver them. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        # Must precede closing the fd: wakes a task in wait_readable with
        # ClosedResourceError instead of leaving it on a dead fd. Outside
        # trio.run (RuntimeError) nobody can be waiting.
        with contextlib.suppress(RuntimeError):
            trio.lowlevel.notify_closing(self._fd)
        for waiter in self._waiters.values():
            waiter.event.set()
        self._sock.close(linger=linger)

    async def aclose(self) -> None:
        """Async spelling of :meth:`close` (trio AsyncResource style)."""
        self.close()
        await trio.lowlevel.checkpoint()

    def __enter__(self) -> TrioSocket:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
