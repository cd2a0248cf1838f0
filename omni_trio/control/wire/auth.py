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

Every frame is hashed, on every socket: tensors' bytes between hosts do not travel in messages but
on bulk connections of their own, sealed with a key from the same secret (:mod:`omni_trio.comm.bulk`).
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

    def seal(self, frames: Sequence[Frame]) -> list[Frame]:
        """``frames`` with their proof: what a socket sends."""

    def open(self, frames: list[bytes], source: str) -> list[bytes] | None:
        """A received message without its proof; None (counted and reported) if it has no valid one."""


@functools.lru_cache(maxsize=64)  # bounded: a received message's shape is chosen before its proof is checked
def _header(frames: int) -> struct.Struct:
    """The layout of what the proof covers first: the kind, the frames' lengths."""
    return struct.Struct(f"<BQ{frames}Q")


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

    def _mac(self, frames: Sequence[Frame]) -> bytes:
        lengths = [frame.nbytes if type(frame) is memoryview else len(frame) for frame in frames]
        # A copy of the keyed state: the key is neither parsed nor compressed again per message.
        mac = self._keyed.copy()
        mac.update(_header(len(lengths)).pack(_MESSAGE, len(lengths), *lengths))
        for frame in frames:
            mac.update(frame.buffer if isinstance(frame, zmq.Frame) else frame)
        return mac.digest()

    def seal(self, frames: Sequence[Frame]) -> list[Frame]:
        """``frames`` followed by their proof."""
        return [*frames, self._mac(frames)]

    def open(self, frames: list[bytes], source: str) -> list[bytes] | None:
        """``frames`` without their proof, or None when the proof is missing or wrong."""
        if len(frames) < 2:
            self._refuse(source, f"{len(frames)} frame(s), no room for a proof")
            return None
        body, proof = frames[:-1], frames[-1]
        if len(proof) != MAC_BYTES or not hmac.compare_digest(proof, self._mac(body)):
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
