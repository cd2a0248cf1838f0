"""Tensor bytes between hosts on connections of their own, sealed with AES-GCM, received into place.

A ``tcp`` DataRef travels in its control message over the run's CURVE socket (:mod:`omni_trio.comm.tcp`);
its tensors' bytes do not. The sending process *offers* them (:meth:`BulkServer.offer`: a random
transfer id, the tensors' own memory, nothing copied) and names in the DataRef where it listens and
the transfer's id; the receiving process *fetches* them (:meth:`BulkFetcher.fetch`) on a bulk
connection to that listener, straight into one ``torch.empty`` buffer its tensors are views of. The
offer ends with the transfer's ACK (or the receiver's death, or the ACK's timeout).

A connection (:mod:`omni_trio.comm.bulk_seal` says how it is sealed):

1. the listener sends a fresh nonce; the connecting side answers with its own and its first request
   (the transfer's id and size), sealed with the key both nonces and the run's secret give;
2. the listener answers each request with a sealed status, then, when it holds the transfer, each
   tensor's bytes in sealed records of 1 MiB, in the DataRef's order: the fetcher opens each record
   from a scratch buffer into the tensor's place;
3. the connection stays open for the next request (the fetcher keeps a few idle per listener; a
   fetch that finds none idle opens another, so concurrent transfers use parallel connections).

What is refused, counted (:attr:`BulkServer.refused`, :attr:`BulkFetcher.refused`) and reported
(``bulk_refused`` in the log, 1st, 2nd, 4th, ...): a connection whose first request does not open
with the run's key, or that sends none within ``proof_timeout_s``, or that comes while
``max_unproven`` others have not proven themselves yet (closed at once); a record whose tag does not
hold (the fetch fails, and with it the request the object was for; its connection is closed). No
byte of a connection is used before its record's tag held: a tensor's buffer is handed over only
once every record of it opened.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import secrets
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from omni_trio.comm.bulk_seal import CHUNK, NONCE_BYTES, TAG_BYTES, RecordSealer, connection_key
from omni_trio.comm.descriptors import NO_DESCRIPTOR, open_reserve
from omni_trio.comm.layout import TensorEntry
from omni_trio.tracing.trace import get_logger

if TYPE_CHECKING:
    import torch

__all__ = ["BulkFetcher", "BulkRefused", "BulkServer", "TransferGone"]

log = get_logger(__name__)

#: A transfer's id (random: it names one offer, the key proves the peer).
TRANSFER_ID_BYTES = 16
_REQUEST = TRANSFER_ID_BYTES + 8
_SEALED_REQUEST = _REQUEST + TAG_BYTES
_SEALED_STATUS = 1 + TAG_BYTES
_TO_LISTENER, _TO_FETCHER = 1, 2
_HELD, _GONE = b"\0", b"\1"
#: Idle connections a fetcher keeps to one listener.
_IDLE_PER_LISTENER = 4
#: A buffer at least this big is faulted in by a thread while its records arrive: a fresh 64 MiB costs
#: ~18 ms of page faults, which the thread takes off the receiving loop (it waits for the wire anyway).
_POPULATE_FROM = 4 << 20
_MADV_POPULATE_WRITE = 23


class BulkRefused(ConnectionError):
    """A bulk record did not open with the run's key: its bytes were dropped, its connection closed."""


class TransferGone(LookupError):
    """The sender holds no such transfer any more (settled: its request failed or was aborted)."""


class _Refusals:
    def __init__(self, process: str, side: str) -> None:
        self.process = process
        self._side = side
        self.count = 0

    def note(self, reason: str) -> None:
        self.count += 1
        if self.count & (self.count - 1) == 0:
            log.warning("bulk_refused", process=self.process, side=self._side, reason=reason, refused=self.count)


async def _receive_exactly(sock: trio.socket.SocketType, view: memoryview) -> bool:
    """Fill ``view`` from ``sock``; False when the peer closed first."""
    while view:
        got = await sock.recv_into(view)
        if not got:
            return False
        view = view[got:]
    return True


async def _send_all(sock: trio.socket.SocketType, view: memoryview | bytes) -> None:
    view = memoryview(view)
    while view:
        view = view[await sock.send(view) :]


class BulkServer:
    """Where one process offers the tensor bytes it sends to other hosts (see the module docstring).

    ``secret``: the run's; ``proof_timeout_s`` and ``max_unproven``: how long a connection may take to
    send its first sealed request, and how many may be waiting to (its inbox's limits).
    """

    def __init__(
        self, secret: bytes, *, process: str = "", proof_timeout_s: float = 5.0, max_unproven: int = 64
    ) -> None:
        self._secret = secret
        self._proof_timeout_s = proof_timeout_s
        self._max_unproven = max_unproven
        self._unproven = 0
        self._offers: dict[bytes, tuple[memoryview, ...]] = {}
        self._listener: socket.socket | None = None  # accepted without blocking when trio says it is readable
        self._refusals = _Refusals(process, "listener")
        self._reserve: int | None = None  # a descriptor for the moment none is free (while serving)
        self._connection_closed = trio.Event()
        self.address: tuple[str, int] | None = None

    @property
    def refused(self) -> int:
        """Connections refused so far (no valid first request in time, or over the cap)."""
        return self._refusals.count

    @property
    def offered(self) -> int:
        """Transfers offered and not yet withdrawn."""
        return len(self._offers)

    def bind(self, host: str) -> tuple[str, int]:
        """Listen at ``host`` on a free port (once; later calls return the first address); :meth:`serve` accepts."""
        if self.address is None:
            raw = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
            raw.setblocking(False)
            self._listener = raw
            self._reserve = open_reserve()  # now, while descriptors are free (serve() closes it)
            self.address = (host, raw.getsockname()[1])
        return self.address

    def offer(self, frames: Sequence[memoryview]) -> bytes:
        """Hold ``frames`` (each tensor's bytes, not copied: do not change them) for one fetch; the
        transfer's id."""
        transfer = secrets.token_bytes(TRANSFER_ID_BYTES)
        self._offers[transfer] = tuple(frames)
        return transfer

    def withdraw(self, transfer: bytes) -> None:
        """Drop the offer ``transfer`` (its ACK came, or never will)."""
        self._offers.pop(transfer, None)

    async def serve(self) -> None:
        """Accept and serve connections until cancelled (the listener closes then).

        With no descriptor free, the next waiting connection is accepted with the one held in reserve
        and closed (refused, counted); should that not help, accepting waits until one of this
        listener's connections closes. The process serves on whatever its descriptors do
        (:mod:`omni_trio.comm.descriptors`).
        """
        assert self._listener is not None, "bind first"
        listener = self._listener
        try:
            with listener:
                async with trio.open_nursery() as nursery:
                    while True:
                        await trio.lowlevel.wait_readable(listener)
                        try:
                            raw, _ = listener.accept()
                        except (BlockingIOError, InterruptedError):
                            continue  # taken back by the peer meanwhile
                        except OSError as exc:
                            if exc.errno == errno.ECONNABORTED:
                                continue
                            if exc.errno not in NO_DESCRIPTOR:
                                raise
                            if not self._refuse_waiting():
                                log.warning("bulk_listener_paused", process=self._refusals.process,
                                            reason="no descriptor free, none in reserve")
                                await self._connection_closed.wait()
                            continue
                        if self._unproven >= self._max_unproven:
                            self._refusals.note("too many connections not yet proven")
                            raw.close()
                            continue
                        nursery.start_soon(self._serve_connection, trio.socket.from_stdlib_socket(raw))
        finally:
            if self._reserve is not None:
                os.close(self._reserve)
                self._reserve = None

    def _refuse_waiting(self) -> bool:
        """No descriptor is free: accept the next waiting connection with the one in reserve and close it
        (refused, counted). Whether that helped (without a reserve, or should the system have none
        either, it did not)."""
        assert self._listener is not None
        if self._reserve is None:
            self._reserve = open_reserve()
            return False
        os.close(self._reserve)
        self._reserve = None
        try:
            raw, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return True  # nobody waits after all (Linux's accept takes a descriptor before it looks)
        except OSError as exc:
            if exc.errno not in NO_DESCRIPTOR and exc.errno != errno.ECONNABORTED:
                raise
            return exc.errno == errno.ECONNABORTED
        else:
            raw.close()
            self._refusals.note("no descriptor free")
            return True
        finally:
            self._reserve = open_reserve()

    async def _serve_connection(self, conn: trio.socket.SocketType) -> None:
        # A peer that goes away mid-transfer (its fetch was cancelled, its process died) ends only its
        # connection.
        try:
            await self._serve_open_connection(conn)
        finally:
            # A descriptor is free again: a listener paused for want of one accepts again.
            self._connection_closed.set()
            self._connection_closed = trio.Event()

    async def _serve_open_connection(self, conn: trio.socket.SocketType) -> None:
        with conn, contextlib.suppress(OSError):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = secrets.token_bytes(NONCE_BYTES)
            first = memoryview(bytearray(NONCE_BYTES + _SEALED_REQUEST))
            self._unproven += 1
            received = False
            try:
                with trio.move_on_after(self._proof_timeout_s):
                    await _send_all(conn, nonce)
                    received = await _receive_exactly(conn, first)
                if not received:
                    self._refusals.note("no request in time")
                    return
            finally:
                self._unproven -= 1
            key = connection_key(self._secret, nonce, bytes(first[:NONCE_BYTES]))
            requests, answers = RecordSealer(key, _TO_LISTENER), RecordSealer(key, _TO_FETCHER)
            sealed = bytes(first[NONCE_BYTES:])
            scratch = memoryview(bytearray(CHUNK + TAG_BYTES))
            while True:
                request = requests.open(sealed)
                if request is None:
                    self._refusals.note("a request without the run's key")
                    return
                await self._answer(conn, answers, request, scratch)
                following = memoryview(bytearray(_SEALED_REQUEST))
                if not await _receive_exactly(conn, following):
                    return
                sealed = bytes(following)

    async def _answer(
        self, conn: trio.socket.SocketType, answers: RecordSealer, request: bytes, scratch: memoryview
    ) -> None:
        frames = self._offers.get(request[:TRANSFER_ID_BYTES])
        size = int.from_bytes(request[TRANSFER_ID_BYTES:], "little")
        if frames is None or sum(frame.nbytes for frame in frames) != size:
            await _send_all(conn, answers.seal(_GONE))
            return
        await _send_all(conn, answers.seal(_HELD))
        for frame in frames:
            for start in range(0, frame.nbytes, CHUNK):
                written = answers.seal_into(frame[start : start + CHUNK], scratch)
                await _send_all(conn, scratch[:written])


def _populate(address: int, length: int) -> None:
    """Fault in the pages of ``length`` bytes at ``address`` without changing a byte (the records may be
    landing there meanwhile). A kernel without MADV_POPULATE_WRITE (before 5.14) refuses: the writes
    fault the pages in, as without this."""
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    if start < address + length:
        _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(address + length - start), _MADV_POPULATE_WRITE)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class _Connection:
    """A fetcher's end of one bulk connection."""

    def __init__(self, sock: trio.socket.SocketType, key: bytes) -> None:
        self.sock = sock
        self.requests = RecordSealer(key, _TO_LISTENER)
        self.answers = RecordSealer(key, _TO_FETCHER)
        self.scratch = memoryview(bytearray(CHUNK + TAG_BYTES))


class BulkFetcher:
    """How one process fetches the tensor bytes offered to it (see the module docstring)."""

    def __init__(self, secret: bytes, *, process: str = "") -> None:
        self._secret = secret
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._refusals = _Refusals(process, "fetcher")

    @property
    def refused(self) -> int:
        """Records refused so far (each failed its fetch)."""
        return self._refusals.count

    @property
    def idle(self) -> int:
        """Connections kept open for the next fetch."""
        return sum(len(connections) for connections in self._idle.values())

    async def fetch(
        self, address: tuple[str, int], transfer: bytes, entries: Sequence[TensorEntry], size: int
    ) -> torch.Tensor:
        """The ``size`` bytes of the transfer offered at ``address``, each entry's at its offset, in one
        new uint8 tensor. Raises :class:`TransferGone`, :class:`BulkRefused` or ``OSError``."""
        import torch

        # The offer's bytes: the entries' own, without the layout's alignment gaps.
        request = transfer + sum(entry.size for entry in entries).to_bytes(8, "little")
        idle = self._idle.get(address)
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                conn = await self._connect(address, request)
            else:
                await _send_all(conn.sock, conn.requests.seal(request))
            buffer = torch.empty(size, dtype=torch.uint8)
            failed: OSError | TransferGone | None = None
            async with trio.open_nursery() as nursery:
                if size >= _POPULATE_FROM:
                    nursery.start_soon(trio.to_thread.run_sync, _populate, buffer.data_ptr(), size)
                try:
                    await self._receive(conn, entries, memoryview(buffer.numpy()))  # type: ignore[arg-type]
                except (OSError, TransferGone) as exc:  # raised as it is, not in the nursery's group
                    failed = exc
            if failed is not None:
                raise failed
        except BaseException:
            if conn is not None:
                conn.sock.close()
            raise
        # A refused transfer (TransferGone) leaves its connection in step too, but it is rare: closed above.
        kept = self._idle.setdefault(address, [])
        if len(kept) < _IDLE_PER_LISTENER:
            kept.append(conn)
        else:
            conn.sock.close()
        return buffer

    async def _connect(self, address: tuple[str, int], request: bytes) -> _Connection:
        sock = trio.socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
        try:
            await sock.connect(address)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            theirs = memoryview(bytearray(NONCE_BYTES))
            if not await _receive_exactly(sock, theirs):
                raise ConnectionError(f"the bulk listener at {address} closed at once")
            ours = secrets.token_bytes(NONCE_BYTES)
            conn = _Connection(sock, connection_key(self._secret, bytes(theirs), ours))
            await _send_all(sock, ours + conn.requests.seal(request))
        except BaseException:
            sock.close()
            raise
        return conn

    async def _receive(self, conn: _Connection, entries: Sequence[TensorEntry], buffer: memoryview) -> None:
        status = memoryview(bytearray(_SEALED_STATUS))
        if not await _receive_exactly(conn.sock, status):
            raise ConnectionError("the bulk listener closed the connection")
        answer = conn.answers.open(bytes(status))
        if answer is None:
            self._refusals.note("a status without the run's key")
            raise BulkRefused("a bulk status record did not open with the run's key")
        if answer != _HELD:
            raise TransferGone("the sender holds this transfer no more")
        for entry in entries:
            for start in range(0, entry.size, CHUNK):
                length = min(CHUNK, entry.size - start)
                record = conn.scratch[: length + TAG_BYTES]
                if not await _receive_exactly(conn.sock, record):
                    raise ConnectionError("the bulk listener closed the connection in a transfer")
                place = buffer[entry.offset + start : entry.offset + start + length]
                if not conn.answers.open_into(record, place):
                    self._refusals.note("a data record without the run's key")
                    raise BulkRefused("a bulk data record did not open with the run's key")

    def close(self) -> None:
        """Close the idle connections (a fetch under way closes its own when it is cancelled)."""
        for connections in self._idle.values():
            for conn in connections:
                with contextlib.suppress(OSError):
                    conn.sock.close()
        self._idle.clear()
