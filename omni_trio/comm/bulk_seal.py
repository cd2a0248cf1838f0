"""The records of a bulk connection (:mod:`omni_trio.comm.bulk`), each sealed with AES-256-GCM.

A bulk connection's key is derived from the run's secret (the one its :class:`~omni_trio.control.wire.auth.FrameMac`
proves messages with) and two fresh nonces, one from each side (:func:`connection_key`): a keyed
BLAKE2b, so only a holder of the run's secret gets the key, and a recorded connection replayed to a
new one opens nothing (the listener's nonce is new). Each direction numbers its records: record ``n``
of a direction is sealed under the nonce ``direction || n``, so a record dropped, repeated, reordered
or moved to the other direction fails its tag, as does any changed byte. AES-GCM runs on AES-NI
(``cryptography``, imported by the first connection: a run on one host never loads it): sealing or
opening 1 MiB costs ~0.1 ms here, far below what the wire takes for it.

Every byte after the two nonces is sealed, the tensors' included: confidential and authenticated, as
CURVE makes the control messages between hosts.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["CHUNK", "NONCE_BYTES", "TAG_BYTES", "RecordSealer", "connection_key"]

#: Each side's fresh nonce at the start of a connection.
NONCE_BYTES = 16
#: What AES-GCM adds to each record.
TAG_BYTES = 16
#: The most a data record seals: a tensor travels in records of this size (its last one shorter).
CHUNK = 1 << 20
#: What the key derivation is for (BLAKE2b's personalisation).
_PURPOSE = b"omni-trio bulk"


def connection_key(secret: bytes, listener_nonce: bytes, connector_nonce: bytes) -> bytes:
    """The AES-256 key of one bulk connection."""
    mac = hashlib.blake2b(key=secret, digest_size=32, person=_PURPOSE)
    mac.update(listener_nonce + connector_nonce)
    return mac.digest()


class RecordSealer:
    """One direction of one connection: seals (or opens) its records in order."""

    def __init__(self, key: bytes, direction: int) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._invalid = InvalidTag
        self._cipher = Cipher
        self._aes = algorithms.AES(key)
        self._gcm = modes.GCM
        self._aead = AESGCM(key)
        self._prefix = bytes([direction])
        self._count = 0

    def _nonce(self) -> bytes:
        nonce = self._prefix + self._count.to_bytes(11, "big")
        self._count += 1
        return nonce

    def seal(self, plain: bytes) -> bytes:
        """A small record (a request, a status) sealed."""
        return self._aead.encrypt(self._nonce(), plain, None)

    def open(self, sealed: bytes) -> bytes | None:
        """A small record opened; None when it is not the next sealed record of this direction."""
        try:
            return self._aead.decrypt(self._nonce(), sealed, None)
        except self._invalid:
            return None

    def seal_into(self, plain: memoryview, out: memoryview) -> int:
        """Seal ``plain`` (at most :data:`CHUNK` bytes) into ``out``, its tag after it; the bytes written."""
        size = plain.nbytes
        sealer: Any = self._cipher(self._aes, self._gcm(self._nonce())).encryptor()
        sealer.update_into(plain, out)
        sealer.finalize()
        out[size : size + TAG_BYTES] = sealer.tag
        return size + TAG_BYTES

    def open_into(self, sealed: memoryview, out: memoryview) -> bool:
        """Open ``sealed`` (a record and its tag) into ``out`` (the record's size); whether its tag held.
        When it did not, ``out`` holds garbage that must not be used."""
        size = sealed.nbytes - TAG_BYTES
        opener: Any = self._cipher(self._aes, self._gcm(self._nonce())).decryptor()
        opener.update_into(sealed[:size], out)
        try:
            opener.finalize_with_tag(bytes(sealed[size:]))
        except self._invalid:
            return False
        return True
