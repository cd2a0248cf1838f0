"""Shared-memory relay for host memory (SPEC §8.7), Linux ``/dev/shm``.

One transfer = one segment: the sender creates ``/dev/shm/<prefix>-<n>``,
fills it, closes its mapping and sends the name in a DataReady; the receiver
maps it, copies the bytes out, closes and **unlinks** it (the receiver owns
deletion), then ACKs. The sender's :meth:`ShmRelay.settle` returns the credit
and, on a failed or missing ACK, removes the segment if it still exists.

Why not ``multiprocessing.shared_memory``: its resource tracker registers
every segment in the creating *and* every attaching process and "cleans up"
(unlinks) segments another process still needs, with warnings at exit
(SPEC §8.7 [FIX]). Plain ``os.open`` + ``mmap`` has no tracker; leftovers
after a crash are removed by the supervisor with :func:`remove_segments`,
which is why every name starts with a caller-chosen prefix
(``"omnitrio-<runid>-<pid>"``).

Copies of 1 MiB and more run in a worker thread (``trio.to_thread``) so that
co-located stages and ACKs are not stalled (SPEC §9 item 9).

Back-pressure: each target has its own credits (a ``trio.Semaphore``); a put
waits for a credit of *its* target only, so one slow consumer does not block
the producer's other edges (SPEC §9 item 7). Each put counts as one transfer
whatever it holds: callers pack a chunk and its metadata tensors into one
buffer (SPEC §9 item 6).
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import re
import stat
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

__all__ = [
    "DEFAULT_MAX_TRANSFER_BYTES",
    "OFF_THREAD_BYTES",
    "SHM_DIR",
    "SegmentNotFound",
    "ShmError",
    "ShmPut",
    "ShmRelay",
    "TransferTooLarge",
    "read_segment",
    "remove_segments",
]

T = TypeVar("T")

#: Where POSIX shared-memory segments live on Linux.
SHM_DIR = "/dev/shm"
#: Default per-transfer limit (the reference's ``slot_size_mb`` default).
DEFAULT_MAX_TRANSFER_BYTES = 512 * 1024 * 1024
#: Segments at least this large are created/filled/read in a worker thread.
OFF_THREAD_BYTES = 1024 * 1024

# Names travel in control messages from other processes and are joined to
# SHM_DIR before open+unlink: restrict them to one plain path component.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}")


class ShmError(Exception):
    """Base class of shared-memory relay errors."""


class TransferTooLarge(ShmError, ValueError):
    """A transfer exceeds the relay's per-transfer limit (fails the request only)."""


class SegmentNotFound(ShmError, FileNotFoundError):
    """A segment to read is missing or does not have the announced size."""


@attrs.frozen
class ShmPut:
    """One outstanding segment written by :meth:`ShmRelay.put`."""

    name: str
    size: int

    def info(self) -> dict[str, Any]:
        """The relay's put metadata, carried verbatim in ``DataRef.buffer.info``."""
        return {"shm_name": self.name, "size": self.size}


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"invalid shared-memory segment name {name!r}")
    return name


def _segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, _check_name(name))


def _unlink_quiet(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


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


def _create_and_fill(path: str, size: int, fill: Callable[[memoryview], None]) -> None:
    # O_EXCL: never adopt an existing file (a stale or planted one); it also
    # refuses to follow a symlink at that name.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.ftruncate(fd, size)
            try:
                # Reserve the tmpfs pages now: a full /dev/shm then fails here
                # with ENOSPC instead of killing the process with SIGBUS when
                # the copy touches an unbacked page. It also turns the page
                # faults during the copy into cheap minor faults.
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise ShmError(f"not enough space in {SHM_DIR} for a {size}-byte transfer") from exc
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _run_on_mapping(mm, fill, os.path.basename(path))
    except BaseException:
        _unlink_quiet(path)
        raise


def _open_and_consume(path: str, name: str, size: int, consume: Callable[[memoryview], T], zero_copy: bool) -> T:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        # ELOOP: a symlink planted at that name (O_NOFOLLOW) is not a segment.
        if isinstance(exc, FileNotFoundError) or exc.errno == errno.ELOOP:
            raise SegmentNotFound(f"shared-memory segment {name} not found") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SegmentNotFound(f"shared-memory segment {name} not found (not a regular file)")
        if st.st_size != size:
            # Not unlinked: a wrong size means a wrong name or a bug, and the
            # file may belong to another transfer; the sender cleans up its own.
            raise SegmentNotFound(
                f"shared-memory segment {name} not found with the expected size {size} (it has {st.st_size} bytes)"
            )
        # Shared + writable (the fd is ours now) so that torch.frombuffer on
        # the view neither warns about read-only memory nor copies on write.
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    # Unlink as soon as it is mapped: the data stays reachable through the
    # mapping, and the name can no longer leak whatever happens next.
    _unlink_quiet(path)
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
    _check_name(name)
    if prefix is not None and not name.startswith(prefix + "-"):
        raise ValueError(f"shared-memory segment {name!r} does not belong to prefix {prefix!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"invalid shared-memory segment size {size!r}")
    path = _segment_path(name)
    if size >= OFF_THREAD_BYTES:
        return await trio.to_thread.run_sync(_open_and_consume, path, name, size, consume, zero_copy)
    await trio.lowlevel.checkpoint()
    return _open_and_consume(path, name, size, consume, zero_copy)


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _NAME_RE.fullmatch(prefix):
        raise ValueError(f"invalid shared-memory prefix {prefix!r} (use letters, digits, '_', '.', '-')")
    return prefix


def remove_segments(prefix: str) -> list[str]:
    """Unlink every segment named ``<prefix>-<n>`` (or ``<prefix>-<a>-<n>``...).

    For supervisors: after a process died, remove what it left in /dev/shm.
    A prefix only matches at a ``-`` boundary followed by numbers, so
    ``"omnitrio-r1-12"`` does not remove ``"omnitrio-r1-123-0"``, while
    ``"omnitrio-r1"`` removes the segments of every process of run ``r1``.
    Returns the names removed.
    """
    pattern = re.compile(re.escape(_check_prefix(prefix)) + r"(?:-[0-9]+)+")
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if pattern.fullmatch(name) and _unlink_quiet(os.path.join(SHM_DIR, name)):
            removed.append(name)
    return sorted(removed)


class ShmRelay:
    """Sender side of the shared-memory relay, with per-target credits.

    ``prefix`` names every segment (``f"{prefix}-{counter}"``); make it unique
    per process (``"omnitrio-<runid>-<pid>"``). ``credits_per_target`` is how
    many puts to one target may be outstanding (put but not settled);
    ``max_transfer_bytes`` bounds one transfer.

    Lifecycle of one transfer: ``put`` → send DataReady with ``put.info()`` →
    the ACK (or its failure/timeout, or the request's abort) → ``settle``.
    Every put must be settled exactly once; extra settles are ignored.
    """

    #: Data lives in host memory.
    device = "cpu"

    def __init__(
        self,
        prefix: str,
        *,
        credits_per_target: int = 2,
        max_transfer_bytes: int = DEFAULT_MAX_TRANSFER_BYTES,
    ) -> None:
        if credits_per_target < 1:
            raise ValueError("credits_per_target must be at least 1")
        if max_transfer_bytes < 1:
            raise ValueError("max_transfer_bytes must be at least 1")
        if not os.path.isdir(SHM_DIR):
            raise ShmError(f"{SHM_DIR} is not available; the shm relay needs Linux POSIX shared memory")
        self.prefix = _check_prefix(prefix)
        self.credits_per_target = credits_per_target
        self.max_transfer_bytes = max_transfer_bytes
        self._counter = itertools.count()
        self._credits: dict[str, trio.Semaphore] = {}
        # name -> (target, put); insertion order = put order.
        self._outstanding: dict[str, tuple[str, ShmPut]] = {}
        self._closed = False

    def _semaphore(self, target: str) -> trio.Semaphore:
        sem = self._credits.get(target)
        if sem is None:
            sem = self._credits[target] = trio.Semaphore(self.credits_per_target)
        return sem

    async def put(self, target: str, nbytes: int, fill: Callable[[memoryview], None]) -> ShmPut:
        """Take a credit of ``target``, create a segment of ``nbytes`` and fill it.

        ``fill`` receives a writable memoryview of exactly the segment's size
        and must not keep views of it. It runs in a worker thread when the
        segment is at least ``OFF_THREAD_BYTES`` (so it must not touch trio).
        A zero-byte transfer gets a 1-byte segment. Waits while ``target``
        has no free credit. Raises TransferTooLarge when ``nbytes`` exceeds
        ``max_transfer_bytes``. On any failure (including cancellation) the
        segment is removed and the credit returned.
        """
        if self._closed:
            raise trio.ClosedResourceError("shm relay is closed")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"invalid transfer size {nbytes!r}")
        if nbytes > self.max_transfer_bytes:
            raise TransferTooLarge(
                f"transfer of {nbytes} bytes exceeds the shared-memory relay limit of "
                f"{self.max_transfer_bytes} bytes (max_transfer_bytes)"
            )
        size = max(nbytes, 1)
        sem = self._semaphore(target)
        await sem.acquire()
        name = f"{self.prefix}-{next(self._counter)}"
        path = os.path.join(SHM_DIR, name)
        try:
            if self._closed:
                raise trio.ClosedResourceError("shm relay is closed")
            if size >= OFF_THREAD_BYTES:
                await trio.to_thread.run_sync(_create_and_fill, path, size, fill)
            else:
                _create_and_fill(path, size, fill)
        except BaseException:
            _unlink_quiet(path)
            sem.release()
            raise
        put = ShmPut(name=name, size=size)
        # No checkpoint between the fill and this registration: a put that
        # returned is always tracked, so settle/aclose can clean it up.
        self._outstanding[name] = (target, put)
        return put

    def settle(self, put: ShmPut, success: bool) -> None:
        """Finish a transfer: return its credit; on failure remove the segment.

        Call it when the receiver's ACK arrives (``success`` as ACKed), or
        with ``success=False`` on ACK timeout or the request's abort. After a
        successful ACK the receiver has already unlinked the segment; we
        unlink again anyway (a no-op then) so that a receiver that ACKed
        without reading cannot leak it. Idempotent.
        """
        entry = self._outstanding.pop(put.name, None)
        if entry is None:
            return
        target, _ = entry
        # Unlink whatever ``success`` says: after a failure the segment is
        # ours to remove; after a success the receiver already did and this
        # is a cheap ENOENT (names are never reused, so it cannot hit another
        # transfer's segment).
        _unlink_quiet(os.path.join(SHM_DIR, put.name))
        self._credits[target].release()

    def in_use(self, target: str | None = None) -> int:
        """Outstanding (put, not settled) transfers, across targets or for one."""
        if target is None:
            return len(self._outstanding)
        return sum(1 for t, _ in self._outstanding.values() if t == target)

    def outstanding(self) -> list[ShmPut]:
        """The puts not settled yet, oldest first."""
        return [put for _, put in self._outstanding.values()]

    async def aclose(self) -> None:
        """Unlink every outstanding segment and refuse further puts. Idempotent."""
        self._closed = True
        for put in self.outstanding():
            self.settle(put, False)
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ShmRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
