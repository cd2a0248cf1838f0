"""Proof that a message comes from this run: a keyed MAC on every message of every socket.

The caller generates a secret for each run (:func:`new_secret`) and hands it to its workers in
their spec file (mode 0600, in the run's private 0700 directory). Every message a socket of the run
sends gets one more frame, last: a 16-byte keyed BLAKE2b of the message (the number and lengths of
its frames first, so that frames cannot be split, joined or moved). A receiving socket checks that
frame before anything of the message is decoded: a message without a valid proof (none, garbage, a
forgery, one made with another run's secret) is counted, reported and dropped, and none of its bytes
reach the decoder, let alone the unpickler that reads payload headers.

:class:`Authenticator` is what a socket needs of this (see :mod:`omni_trio.control.sockets.zmq_trio`): a
process builds one and hands it, through its endpoint, to every socket it creates. Authentication
over TCP between hosts (CURVE) plugs in at the same place, as another authenticator.

Cost on the hot path: one BLAKE2b of the message on each side, ~1.5 µs for a control message of a
few hundred bytes (benchmarks/NOTES.md, the hop budget); a big pickled header costs ~1 ms per MiB.

On a CURVE connection (``seal(..., over_curve=True)``) the tensor frames (memoryviews of a tensor's
own storage, :mod:`omni_trio.comm.tcp`) are bound by their position and length only, not hashed:
libzmq already authenticates every frame of such a connection, whose peers hold the run's key, and
hashing hundreds of MiB again cost more than the encryption. The proof then ends with the indexes of
those frames (covered by the MAC itself, so they cannot be changed); everything a decoder or the
unpickler reads (the tag, the body, a pickled header) is still proven on every socket. See
docs/design.md.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence
from typing import Protocol

import zmq

from omni_trio.tracing.trace import Tracer, get_logger

__all__ = ["MAC_BYTES", "Authenticator", "Frame", "FrameMac", "new_secret"]

log = get_logger(__name__)

Frame = bytes | bytearray | memoryview | zmq.Frame

#: Length of the proof frame.
MAC_BYTES = 16
#: Length of a run's secret.
SECRET_BYTES = 32
# What is being proven goes into the MAC first (room for other kinds of proof than a message's).
_MESSAGE = 1


def new_secret() -> bytes:
    """A fresh secret for one run."""
    return secrets.token_bytes(SECRET_BYTES)


class Authenticator(Protocol):
    """What the sockets of one process use to prove their messages and check their peers'."""

    @property
    def secret(self) -> bytes:
        """What a worker of this run needs (in its spec file) to build the same authenticator."""

    @property
    def refused(self) -> int:
        """Messages refused so far by the sockets of this process."""

    def seal(self, frames: Sequence[Frame], *, over_curve: bool = False) -> list[Frame]:
        """``frames`` with their proof: what a socket sends (``over_curve``: on a CURVE connection)."""

    def open(self, frames: list[bytes], source: str) -> list[bytes] | None:
        """A received message without its proof; None (counted and reported) if it has no valid one."""


@functools.lru_cache(maxsize=64)  # bounded: a received message's shape is chosen before its proof is checked
def _header(frames: int, unhashed: int) -> struct.Struct:
    """The layout of what the proof covers first: the kind, the frames' lengths, the unhashed frames."""
    return struct.Struct(f"<BQ{frames}QQ{unhashed}I")


class FrameMac:
    """The :class:`Authenticator` of a run on one host: a keyed BLAKE2b with the run's secret.

    ``process`` and ``tracer`` say where refusals are reported: a ``frame_refused`` trace event for
    each, and a warning in the log for the 1st, 2nd, 4th, 8th... (a flood of forged frames must not
    flood the log).
    """

    def __init__(self, secret: bytes, *, process: str = "", tracer: Tracer | None = None) -> None:
        if type(secret) is not bytes or len(secret) != SECRET_BYTES:
            raise ValueError(f"a run's secret is {SECRET_BYTES} bytes")
        self._secret = secret
        self._keyed = hashlib.blake2b(key=secret, digest_size=MAC_BYTES)
        self._process = process
        self._tracer = tracer
        self._refused = 0

    @property
    def secret(self) -> bytes:
        """The run's secret."""
        return self._secret

    @property
    def refused(self) -> int:
        """Messages refused so far."""
        return self._refused

    def _mac(self, frames: Sequence[Frame], unhashed: tuple[int, ...] = ()) -> bytes:
        lengths = [frame.nbytes if type(frame) is memoryview else len(frame) for frame in frames]
        # A copy of the keyed state: the key is neither parsed nor compressed again per message.
        mac = self._keyed.copy()
        header = _header(len(lengths), len(unhashed))
        mac.update(header.pack(_MESSAGE, len(lengths), *lengths, len(unhashed), *unhashed))
        if unhashed:
            skip = set(unhashed)
            frames = [frame for index, frame in enumerate(frames) if index not in skip]
        for frame in frames:
            mac.update(frame.buffer if isinstance(frame, zmq.Frame) else frame)
        return mac.digest()

    def seal(self, frames: Sequence[Frame], *, over_curve: bool = False) -> list[Frame]:
        """``frames`` followed by their proof; ``over_curve``: the socket is a CURVE connection, its
        tensor frames (memoryviews) are bound by position and length only (see the module docstring)."""
        unhashed = tuple(i for i, frame in enumerate(frames) if type(frame) is memoryview) if over_curve else ()
        proof = self._mac(frames, unhashed)
        if unhashed:
            proof += struct.pack(f"<{len(unhashed)}I", *unhashed)
        return [*frames, proof]

    def open(self, frames: list[bytes], source: str) -> list[bytes] | None:
        """``frames`` without their proof, or None when the proof is missing or wrong."""
        if len(frames) < 2:
            self._refuse(source, f"{len(frames)} frame(s), no room for a proof")
            return None
        body, proof = frames[:-1], frames[-1]
        unhashed: tuple[int, ...] = ()
        if len(proof) != MAC_BYTES:
            extra = len(proof) - MAC_BYTES
            if extra < 0 or extra % 4 or extra // 4 > len(body):
                self._refuse(source, "no valid proof of this run")
                return None
            unhashed = struct.unpack(f"<{extra // 4}I", proof[MAC_BYTES:])
            if any(index >= len(body) for index in unhashed) or list(unhashed) != sorted(set(unhashed)):
                self._refuse(source, "no valid proof of this run")
                return None
        if not hmac.compare_digest(proof[:MAC_BYTES], self._mac(body, unhashed)):
            self._refuse(source, "no valid proof of this run")
            return None
        return body

    def _refuse(self, source: str, reason: str) -> None:
        self._refused += 1
        count = self._refused
        if self._tracer is not None and self._tracer.enabled:
            self._tracer.event("frame_refused", socket=source, reason=reason, refused=count)
        if count & (count - 1) == 0:
            log.warning("frame_refused", process=self._process, socket=source, reason=reason, refused=count)
