"""One-shot segments: created and filled once by the sender, read and unlinked by the receiver.

The slow path of the shared-memory relay (:mod:`omni_trio.comm.shm`): pooling
disabled, a transfer larger than half the pool, or a pool full of lent slots.
The sender creates ``/dev/shm/<prefix>-<n>``, fills it and closes its mapping
(:func:`write_segment`); the receiver maps it, runs its ``consume`` (a copy
out, or views with ``zero_copy``), and **unlinks** it (:func:`read_segment`:
the receiver owns deletion). Copies of ``OFF_THREAD_BYTES`` and more run in a
worker thread (``trio.to_thread``) so that co-located stages and ACKs are not
stalled.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable
from typing import TypeVar

import trio

from omni_trio.comm.segments import (
    OFF_THREAD_BYTES,
    Identity,
    check_name,
    check_size,
    create_mapped,
    identity_of,
    open_mapped,
    segment_path,
    unlink_own,
)

__all__ = ["read_segment", "write_segment"]

T = TypeVar("T")


def _run_on_mapping(mm: mmap.mmap, fn: Callable[[memoryview], T], name: str, *, allow_views: bool = False) -> T:
    """Call ``fn`` on a memoryview of ``mm``, then unmap unless views survive.

    Lifetime is by reference counting, never by an unconditional close:
    ``torch.frombuffer`` keeps a *reference* to the memoryview but no buffer
    export, so ``view.release()`` + ``mm.close()`` would succeed and leave
    such a tensor pointing at unmapped memory (a crash, not a BufferError).
    Instead: if anything still references our view (refcount) or a slice of
    it (``mm.close()`` raises BufferError), the mapping is left to the garbage
    collector, which unmaps it when the last view dies, and the escape is
    reported unless ``allow_views``. If ``fn`` raised, its traceback may hold
    views: nothing is closed explicitly then either.
    """
    view = memoryview(mm)
    # Measured, not assumed (2 on CPython 3.11; newer interpreters count
    # borrowed references differently): any extra reference is an escape.
    baseline = sys.getrefcount(view)
    result = fn(view)
    escaped = sys.getrefcount(view) > baseline
    if not escaped:
        try:
            view.release()
            mm.close()
        except BufferError:  # a slice of the view (or an export of it) survives
            escaped = True
    if escaped and not allow_views:
        raise BufferError(
            f"a view of shared-memory segment {name} outlived its callback; copy the "
            "data out and drop every view (e.g. torch.frombuffer tensors) before returning"
        )
    return result


def _create_and_fill(path: str, size: int, fill: Callable[[memoryview], None]) -> Identity:
    mm, identity = create_mapped(path, size, mmap.MAP_SHARED)
    try:
        _run_on_mapping(mm, fill, os.path.basename(path))
    except BaseException:
        unlink_own(path, identity)
        raise
    return identity


async def write_segment(path: str, size: int, fill: Callable[[memoryview], None]) -> Identity:
    """Create segment ``path`` of ``size`` bytes and run ``fill`` on it (it must keep no views).

    Returns the file's identity, for a later owner-only unlink. A failed creation or fill
    removes its own file (only that one); a cancelled thread call has not started it, a
    started one is not abandoned.
    """
    if size >= OFF_THREAD_BYTES:
        return await trio.to_thread.run_sync(_create_and_fill, path, size, fill)
    return _create_and_fill(path, size, fill)


def _open_and_consume(path: str, name: str, size: int, consume: Callable[[memoryview], T], zero_copy: bool) -> T:
    # MAP_POPULATE: the copy-out reads every page anyway; one populate is
    # cheaper than a fault per page.
    mm, st = open_mapped(path, name, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
    # Unlink as soon as it is mapped: the data stays reachable through the
    # mapping, and the name can no longer leak whatever happens next.
    unlink_own(path, identity_of(st))
    return _run_on_mapping(mm, consume, name, allow_views=zero_copy)


async def read_segment(
    name: str,
    size: int,
    consume: Callable[[memoryview], T],
    *,
    prefix: str | None = None,
    zero_copy: bool = False,
) -> T:
    """Map segment ``name`` (``size`` bytes), run ``consume`` on it, unmap, unlink.

    The receiver owns deletion: the segment is unlinked once opened, whether
    ``consume`` succeeds or not. ``consume`` runs in a worker thread when
    ``size >= OFF_THREAD_BYTES`` (so it must not touch trio).

    By default ``consume`` must not keep views of the memoryview (copy out
    first), else BufferError: a typical ``consume`` copies into
    ``torch.empty(size, dtype=torch.uint8)`` and returns that tensor for
    :func:`~omni_trio.comm.packing.unpack_tensors`. With ``zero_copy=True``
    it may return views instead (``torch.frombuffer(view, dtype=torch.uint8)``):
    the mapping then lives, already unlinked, until the last view is gone,
    which saves the copy but keeps the pages in shared memory that long.

    ``prefix``, if given, is the only name prefix accepted (defence against a
    hostile name pointing at another run's segments).

    Raises SegmentNotFound if the segment is missing or its size differs,
    ValueError for a malformed name or size.
    """
    check_name(name, prefix)
    check_size(size)
    path = segment_path(name)
    if size >= OFF_THREAD_BYTES:
        return await trio.to_thread.run_sync(_open_and_consume, path, name, size, consume, zero_copy)
    await trio.lowlevel.checkpoint()
    return _open_and_consume(path, name, size, consume, zero_copy)
