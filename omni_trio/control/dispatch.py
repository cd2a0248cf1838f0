"""Receive loops: frames from a socket are decoded and handed to the handler of their message type.

A malformed, truncated or unknown frame is logged with the socket it came from and dropped; a
handler that raises loses its message only. Neither ever ends the receive loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import MalformedMessage, decode
from omni_trio.errors import describe_error
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: Messages taken from a socket per wake-up, at most.
RECEIVE_BATCH = 64

M = TypeVar("M", bound=m.ControlMessage)
Handler = Callable[[Any], Awaitable[None]]


class MessageSource(Protocol):
    """What a receive loop reads: a :class:`~omni_trio.control.sockets.zmq_trio.TrioSocket` (``tcp://``) or a
    :class:`~omni_trio.control.sockets.unix_inbox.UnixPull` (this host)."""

    async def recv_multipart(self) -> list[bytes]:
        """One message; raises trio.ClosedResourceError once closed."""
        ...

    def recv_nowait(self) -> list[bytes] | None:
        """One message already here, or None."""
        ...


class Dispatcher:
    """The message handlers of one process, by message type, and the loops that feed them."""

    def __init__(self, process: str) -> None:
        self._process = process
        self._handlers: dict[type[m.ControlMessage], Handler] = {}

    def on(self, message_type: type[M], handler: Callable[[M], Awaitable[None]]) -> None:
        """Handle every ``message_type`` message with ``handler`` (one handler per type)."""
        if message_type in self._handlers:
            raise ValueError(f"{message_type.__name__} already has a handler in process {self._process!r}")
        self._handlers[message_type] = handler

    async def receive_loop(self, sock: MessageSource, source: str, admit: Callable[[], bool] | None = None) -> None:
        """Handle what arrives on ``sock`` until it closes; with ``admit``, only while ``admit()`` says so
        (it is asked for each message, and counts what it refuses).

        Of the messages taken together, the Aborts are handled first (the rest in arrival order): an
        abort storm arrives behind the work it cancels, and a request dropped before its Submit or
        DataReady is handled never reaches a scheduler (the stages refuse work for a dropped id).
        """
        while True:
            try:
                batch = [await sock.recv_multipart()]
                # Take everything already queued before handling any of it: a
                # burst reaches a scheduler's inbox together (and batches there).
                while len(batch) < RECEIVE_BATCH and (frames := sock.recv_nowait()) is not None:
                    batch.append(frames)
            except trio.ClosedResourceError:
                return
            messages = [message for frames in batch if (message := self._decode(frames, source)) is not None]
            for message in sorted(messages, key=_not_an_abort):
                # Asked at handling time: a handler may end what ``admit`` admits.
                if admit is None or admit():
                    await self._handle(message, source)

    def _decode(self, frames: list[bytes], source: str) -> m.ControlMessage | None:
        try:
            return decode(frames)
        except MalformedMessage as exc:
            log.warning("malformed_message_dropped", socket=source, process=self._process, reason=exc.reason)
            return None

    async def _handle(self, message: m.ControlMessage, source: str) -> None:
        handler = self._handlers.get(type(message))
        try:
            if handler is None:
                raise ValueError(f"{type(message).__name__} is not expected by process {self._process!r}")
            await handler(message)
        except Exception as exc:  # noqa: BLE001 - one bad message must not end the receive loop
            log.warning(
                "message_dropped",
                socket=source,
                process=self._process,
                message=type(message).__name__,
                error=describe_error(exc),
            )


def _not_an_abort(message: m.ControlMessage) -> bool:
    """Sort key: Aborts (False) before everything else (True); ``sorted`` keeps arrival order within each."""
    return type(message) is not m.Abort
