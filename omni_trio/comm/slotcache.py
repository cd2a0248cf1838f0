"""The receiving process's mappings of pooled slots (:class:`SegmentCache`).

A receiver maps a pooled slot once and keeps the mapping, so later transfers
through the same slot cost no page fault, and builds its tensors as *views* of
the mapping (no copy). The sender's side is :mod:`omni_trio.comm.slotpool`.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections import OrderedDict
from typing import TYPE_CHECKING

import attrs
import trio

from omni_trio.comm.segments import (
    OFF_THREAD_BYTES,
    SegmentNotFound,
    check_name,
    check_size,
    open_mapped,
    segment_path,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DEFAULT_CACHE_BYTES", "SegmentCache"]

#: Default bytes of pooled segments a receiving process keeps mapped.
DEFAULT_CACHE_BYTES = 1024 * 1024 * 1024


@attrs.define(eq=False)
class _Mapping:
    mm: mmap.mmap
    device: int
    inode: int
    size: int


class SegmentCache:
    """A receiving process's mappings of pooled slots, by name, least recently used evicted first.

    :meth:`view` returns a fresh numpy ``uint8`` array over the first bytes of
    a slot's mapping; the mapping is made once per slot (``MAP_POPULATE``, in a
    worker thread when large) and reused while the slot's file is the same
    (device, inode and size are checked on each use: a slot name of a
    restarted sender is never served from an old mapping). At most
    ``max_bytes`` of mappings are kept; an evicted or discarded mapping is
    unmapped when the last array viewing it is gone, never under a live view.
    Use it from one trio thread only.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._maps: OrderedDict[str, _Mapping] = OrderedDict()
        self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the mappings kept."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._maps)

    def __contains__(self, name: object) -> bool:
        return name in self._maps

    def discard(self, name: str) -> None:
        """Forget the mapping of ``name`` (e.g. after a failed read: the sender retires the slot)."""
        entry = self._maps.pop(name, None)
        if entry is not None:
            self._bytes -= entry.size

    def clear(self) -> None:
        """Forget every mapping."""
        self._maps.clear()
        self._bytes = 0

    async def view(self, name: str, segment_size: int, length: int, *, prefix: str | None = None) -> np.ndarray:
        """A writable ``uint8`` array over bytes ``[0, length)`` of pooled segment ``name``.

        The array's base holds the mapping: tensors made from it (directly or
        as views) keep the memory mapped whatever happens to the cache or the
        segment's name. Raises SegmentNotFound when the segment is missing or
        not a regular file of ``segment_size`` bytes, ValueError for a bad
        name, prefix or size.
        """
        check_name(name, prefix)
        check_size(segment_size)
        check_size(length, "length")
        if length > segment_size:
            raise ValueError(f"length {length} exceeds the segment size {segment_size}")
        path = segment_path(name)
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            self.discard(name)
            raise SegmentNotFound(f"shared-memory segment {name} not found") from None
        entry = self._maps.get(name)
        if entry is not None and (
            not stat.S_ISREG(st.st_mode)
            or (st.st_dev, st.st_ino, st.st_size) != (entry.device, entry.inode, entry.size)
            or entry.size != segment_size
        ):
            self.discard(name)
            entry = None
        if entry is None:
            flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
            if segment_size >= OFF_THREAD_BYTES:
                mm, st = await trio.to_thread.run_sync(open_mapped, path, name, segment_size, flags)
            else:
                await trio.lowlevel.checkpoint()
                mm, st = open_mapped(path, name, segment_size, flags)
            entry = _Mapping(mm=mm, device=st.st_dev, inode=st.st_ino, size=segment_size)
            self.discard(name)  # a concurrent miss of the same name mapped it too
            self._maps[name] = entry
            self._bytes += segment_size
            while self._bytes > self.max_bytes and len(self._maps) > 1:
                _, old = self._maps.popitem(last=False)
                self._bytes -= old.size
        else:
            self._maps.move_to_end(name)
        import numpy

        return numpy.frombuffer(entry.mm, dtype=numpy.uint8, count=length)
