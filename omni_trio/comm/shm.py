"""Shared-memory relay for host memory (SPEC §8.7), Linux ``/dev/shm``.

Two kinds of segment carry a transfer:

* **pooled slots** (the fast path). Each relay (one per sending stage) keeps a
  pool of segments in power-of-two size classes (:func:`slot_size`, from
  ``MIN_SLOT_BYTES``), created on demand with their pages reserved and
  mapped up front (``posix_fallocate`` + ``MAP_POPULATE``), bounded by
  ``pool_bytes`` in all, and reused across transfers. The sender fills a free
  slot through its own long-lived mapping (no page faults, no segment
  creation) and announces ``{"shm_name", "size", "segment_size", "lease"}``.
  The receiver maps the slot once and keeps the mapping (:class:`SegmentCache`),
  so later transfers through the same slot cost no fault either, and builds
  its tensors as *views* of the mapping (no copy). A slot is lent out per
  transfer under a fresh ``lease`` number; it goes back to the pool only when
  both the receiver's ACK said the read succeeded (:meth:`ShmRelay.settle`)
  and the receiver said that no tensor views the slot any more
  (:meth:`ShmRelay.release`, in whichever order they arrive). A failed or
  missing ACK *retires* the slot: it is unlinked and forgotten (a receiver
  that still maps it keeps valid memory; POSIX unlinks while mapped are
  fine), so a slot the sender writes again is never one a receiver may still
  be reading.
* **one-shot segments** (the slow path: pooling disabled, the transfer is
  larger than ``pool_bytes // 2``, or the pool is full of lent slots). The
  sender creates ``/dev/shm/<prefix>-<n>``, fills it, closes its mapping and
  sends the name; the receiver maps it, copies the bytes out, closes and
  **unlinks** it (the receiver owns deletion), then ACKs. The sender's
  :meth:`ShmRelay.settle` returns the credit and, on a failed or missing ACK,
  removes the segment if it still exists.

The ACK settles the credit in both cases (unless the caller keeps it until
the receiver's scheduler has taken the object: ``settle(keep_credit=True)``
then :meth:`ShmRelay.return_credit`): a receiver that keeps a pooled tensor
for a long time holds the slot, never a credit.

One-shot segments are named ``<prefix>-<n>`` and pooled slots
``<prefix>-p<n>``, with ``n`` from one counter per relay (never reused), so
:func:`remove_segments` removes both kinds after a crash,
:func:`is_pooled_slot` tells them apart (a pooled slot exists while its relay
is open, even when the pipeline is idle), and :meth:`ShmRelay.aclose` unlinks
every slot.

Why not ``multiprocessing.shared_memory``: its resource tracker registers
every segment in the creating *and* every attaching process and "cleans up"
(unlinks) segments another process still needs, with warnings at exit
(SPEC §8.7 [FIX]). Plain ``os.open`` + ``mmap`` has no tracker; leftovers
after a crash are removed by the supervisor with :func:`remove_segments`,
which is why every name starts with a caller-chosen prefix (the run's, see
:mod:`omni_trio.comm.ownership`, then the process and relay numbers).

Only the owner removes a segment: every unlink here checks that the name is
a regular file of our effective uid and, where we created or opened it, the
very same file (device and inode); a name that is taken when we create a
segment raises :class:`SegmentExists` and the file is left alone.

Copies of 1 MiB and more run in a worker thread (``trio.to_thread``) so that
co-located stages and ACKs are not stalled (SPEC §9 item 9); so do the
creation of a new slot and the first mapping of a slot by a receiver.

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
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from omni_trio.errors import OmniTrioError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_MAX_TRANSFER_BYTES",
    "DEFAULT_POOL_BYTES",
    "MIN_SLOT_BYTES",
    "OFF_THREAD_BYTES",
    "SHM_DIR",
    "SegmentCache",
    "SegmentExists",
    "SegmentNotFound",
    "ShmError",
    "ShmPut",
    "ShmRelay",
    "TransferTooLarge",
    "freeze_creation",
    "is_pooled_slot",
    "read_segment",
    "remove_segments",
    "slot_size",
]

T = TypeVar("T")

#: Where POSIX shared-memory segments live on Linux.
SHM_DIR = "/dev/shm"
#: Default per-transfer limit (the reference's ``slot_size_mb`` default).
DEFAULT_MAX_TRANSFER_BYTES = 512 * 1024 * 1024
#: Segments at least this large are created/filled/read in a worker thread.
OFF_THREAD_BYTES = 1024 * 1024
#: Default bytes of pooled slots per relay (per sending stage), lent slots included.
DEFAULT_POOL_BYTES = 256 * 1024 * 1024
#: The smallest pooled slot (smaller transfers use one of this size).
MIN_SLOT_BYTES = 64 * 1024
#: Default bytes of pooled segments a receiving process keeps mapped.
DEFAULT_CACHE_BYTES = 1024 * 1024 * 1024

# Names travel in control messages from other processes and are joined to
# SHM_DIR before open+unlink: restrict them to one plain path component.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}")
# Pooled slots are named ``<prefix>-p<n>``, one-shot segments ``<prefix>-<n>``.
_POOLED_RE = re.compile(r"-p[0-9]+\Z")
# Held while a segment file is created: freeze_creation() takes it for good, so that a
# process cleaning up before it exits knows that no thread creates a segment after its sweep.
_CREATION = threading.Lock()
#: (st_dev, st_ino): which file a segment name was when we created or opened it.
Identity = tuple[int, int]


class ShmError(OmniTrioError):
    """Base class of shared-memory relay errors."""


class TransferTooLarge(ShmError, ValueError):
    """A transfer exceeds the relay's per-transfer limit (fails the request only)."""


class SegmentNotFound(ShmError, FileNotFoundError):
    """A segment to read is missing or does not have the announced size."""


class SegmentExists(ShmError, FileExistsError):
    """A segment name to create is taken by a file we did not create (stale or planted): it is left alone."""


@attrs.frozen
class ShmPut:
    """One outstanding transfer written by :meth:`ShmRelay.put`.

    ``size`` is the transfer's length. A pooled put also has the slot's
    ``segment_size`` (at least ``size``) and its ``lease`` number; a one-shot
    put has neither (its segment is exactly ``size`` bytes).
    """

    name: str
    size: int
    segment_size: int | None = None
    lease: int | None = None
    #: The one-shot segment's file as created: a later cleanup unlinks only that file.
    identity: Identity | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def pooled(self) -> bool:
        """True when the transfer went through a pooled slot."""
        return self.lease is not None

    def info(self) -> dict[str, Any]:
        """The relay's put metadata, carried verbatim in ``DataRef.buffer.info``."""
        info: dict[str, Any] = {"shm_name": self.name, "size": self.size}
        if self.lease is not None:
            info["segment_size"] = self.segment_size
            info["lease"] = self.lease
        return info


def slot_size(nbytes: int) -> int:
    """The pooled slot size class of a transfer of ``nbytes``: a power of two, at least MIN_SLOT_BYTES."""
    return max(MIN_SLOT_BYTES, 1 << max(nbytes - 1, 0).bit_length())


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"invalid shared-memory segment name {name!r}")
    return name


def _segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, _check_name(name))


def _identity(st: os.stat_result) -> Identity:
    return st.st_dev, st.st_ino


def _unlink_own(path: str, identity: Identity | None = None) -> bool:
    """Unlink ``path`` if it is a regular file of our effective uid and, given ``identity``, the
    very file we created or opened; a name another user or run planted or replaced is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if identity is not None and _identity(st) != identity:
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def freeze_creation() -> None:
    """Stop this process from creating segments, for good (waits for a creation under way).

    For a process about to exit that sweeps its run's segments first: whatever
    exists after this call is all there will be.
    """
    _CREATION.acquire()


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


def _create_mapped(path: str, size: int, flags: int) -> tuple[mmap.mmap, Identity]:
    """Create segment ``path`` of ``size`` bytes with its pages reserved, and map it."""
    # O_EXCL: never adopt an existing file (a stale or planted one), and never
    # remove it either; it also refuses to follow a symlink at that name.
    with _CREATION:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except FileExistsError as exc:
            raise SegmentExists(f"shared-memory segment {os.path.basename(path)} exists already; left alone") from exc
    identity = _identity(os.fstat(fd))
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
            return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE), identity
        finally:
            os.close(fd)
    except BaseException:
        _unlink_own(path, identity)
        raise


def _create_and_fill(path: str, size: int, fill: Callable[[memoryview], None]) -> Identity:
    mm, identity = _create_mapped(path, size, mmap.MAP_SHARED)
    try:
        _run_on_mapping(mm, fill, os.path.basename(path))
    except BaseException:
        _unlink_own(path, identity)
        raise
    return identity


def _create_slot(path: str, size: int) -> tuple[mmap.mmap, Identity]:
    # MAP_POPULATE: the page tables are filled now, once, so that no fill of
    # this slot ever takes a page fault.
    return _create_mapped(path, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)


def _fill_slot(mm: mmap.mmap, size: int, fill: Callable[[memoryview], None], name: str) -> None:
    """Run ``fill`` on the first ``size`` bytes of a slot's long-lived mapping.

    The mapping stays open (it is the pool's), so an escaped view would not
    dangle, but it would let the sender write into a slot lent to a receiver:
    a view that ``fill`` kept (as counted references to the memoryview it got,
    e.g. a ``torch.frombuffer`` tensor) raises BufferError.
    """
    with memoryview(mm) as whole:
        view = whole[:size]
        baseline = sys.getrefcount(view)
        fill(view)
        escaped = sys.getrefcount(view) > baseline
        if not escaped:
            view.release()
    if escaped:
        raise BufferError(
            f"a view of shared-memory slot {name} outlived its fill callback; drop every view "
            "(e.g. torch.frombuffer tensors) before returning"
        )


def _open_mapped(path: str, name: str, size: int, flags: int) -> tuple[mmap.mmap, os.stat_result]:
    """Open and map an existing segment of exactly ``size`` bytes (never following a symlink)."""
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
        if st.st_uid != os.geteuid():
            # Every process of a run has our uid: another user's file is no segment of ours.
            raise SegmentNotFound(f"shared-memory segment {name} not found (the file belongs to uid {st.st_uid})")
        if st.st_size != size:
            # Not unlinked: a wrong size means a wrong name or a bug, and the
            # file may belong to another transfer; the sender cleans up its own.
            raise SegmentNotFound(
                f"shared-memory segment {name} not found with the expected size {size} (it has {st.st_size} bytes)"
            )
        # Shared + writable (the fd is ours now) so that torch.frombuffer on
        # the view neither warns about read-only memory nor copies on write.
        return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE), st
    finally:
        os.close(fd)


def _open_and_consume(path: str, name: str, size: int, consume: Callable[[memoryview], T], zero_copy: bool) -> T:
    # MAP_POPULATE: the copy-out reads every page anyway; one populate is
    # cheaper than a fault per page.
    mm, st = _open_mapped(path, name, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)
    # Unlink as soon as it is mapped: the data stays reachable through the
    # mapping, and the name can no longer leak whatever happens next.
    _unlink_own(path, _identity(st))
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


def is_pooled_slot(name: str) -> bool:
    """True for the name of a pooled slot (``<prefix>-p<n>``), which lives until its relay closes."""
    return _POOLED_RE.search(name) is not None


def remove_segments(prefix: str) -> list[str]:
    """Unlink every segment named ``<prefix>-<n>`` (or ``<prefix>-<a>-<n>``...), pooled slots included.

    For supervisors: after a process died, remove what it left in /dev/shm.
    Only regular files of our effective uid are removed (never a name another
    user planted). A prefix only matches at a ``-`` boundary followed by
    numbers (the last one may be a pooled slot's ``p<n>``), so ``"omnitrio-r1-12"`` does not
    remove ``"omnitrio-r1-123-0"``, while ``"omnitrio-r1"`` removes the
    segments of every process of run ``r1``. Returns the names removed.
    """
    pattern = re.compile(re.escape(_check_prefix(prefix)) + r"(?:-[0-9]+)*-p?[0-9]+")
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if pattern.fullmatch(name) and _unlink_own(os.path.join(SHM_DIR, name)):
            removed.append(name)
    return sorted(removed)


@attrs.define(eq=False)
class _Slot:
    """One pooled segment and the sender's mapping of it."""

    name: str
    size: int
    mm: mmap.mmap
    identity: Identity
    #: Lent out (being filled, or waiting for its ACK and its release).
    busy: bool = False
    lease: int = -1
    target: str = ""
    acked: bool = False
    released: bool = False
    #: When it was last taken (for evicting the least recently used free slot).
    used: int = 0
    #: A stage's tensor views it (:meth:`ShmRelay.hold`): it stays out of the pool until :meth:`ShmRelay.unhold`.
    held: bool = False


class ShmRelay:
    """Sender side of the shared-memory relay, with per-target credits and a slot pool.

    ``prefix`` names every segment (``f"{prefix}-{counter}"``); make it unique
    per relay (``"<run prefix>-<process>-<relay>"``). ``credits_per_target`` is how
    many puts to one target may be outstanding (put but not settled);
    ``max_transfer_bytes`` bounds one transfer; ``pool_bytes`` bounds the
    pooled slots (0, the default here, disables pooling: every transfer is
    one-shot; the endpoint passes ``comm.pool_mb``, by default
    ``DEFAULT_POOL_BYTES``). A transfer
    is pooled when its slot (:func:`slot_size`) is at most ``pool_bytes // 2``
    and the pool has or can make a free slot of that size (evicting free
    slots of other sizes); otherwise it falls back to a one-shot segment.

    Lifecycle of one transfer: ``put`` → send DataReady with ``put.info()`` →
    the ACK (or its failure/timeout, or the request's abort) → ``settle``;
    for a pooled put, also the receiver's slot release → ``release``, before
    or after the ACK. Every put must be settled exactly once; extra settles
    and unknown or repeated releases are ignored.
    """

    #: Data lives in host memory.
    device = "cpu"

    def __init__(
        self,
        prefix: str,
        *,
        credits_per_target: int = 2,
        max_transfer_bytes: int = DEFAULT_MAX_TRANSFER_BYTES,
        pool_bytes: int = 0,
    ) -> None:
        if credits_per_target < 1:
            raise ValueError("credits_per_target must be at least 1")
        if max_transfer_bytes < 1:
            raise ValueError("max_transfer_bytes must be at least 1")
        if pool_bytes < 0:
            raise ValueError("pool_bytes must be at least 0")
        if not os.path.isdir(SHM_DIR):
            raise ShmError(f"{SHM_DIR} is not available; the shm relay needs Linux POSIX shared memory")
        self.prefix = _check_prefix(prefix)
        self.credits_per_target = credits_per_target
        self.max_transfer_bytes = max_transfer_bytes
        self.pool_bytes = pool_bytes
        self._counter = itertools.count()
        self._leases = itertools.count()
        self._uses = itertools.count()
        self._credits: dict[str, trio.Semaphore] = {}
        # name -> (target, put); insertion order = put order.
        self._outstanding: dict[str, tuple[str, ShmPut]] = {}
        # name -> slot, every pooled segment that exists; bytes counts them
        # and the slots being created.
        self._slots: dict[str, _Slot] = {}
        self._pooled_bytes = 0
        self._closed = False

    def _semaphore(self, target: str) -> trio.Semaphore:
        sem = self._credits.get(target)
        if sem is None:
            sem = self._credits[target] = trio.Semaphore(self.credits_per_target)
        return sem

    def _next_name(self) -> str:
        return f"{self.prefix}-{next(self._counter)}"

    async def put(self, target: str, nbytes: int, fill: Callable[[memoryview], None]) -> ShmPut:
        """Take a credit of ``target``, then a pooled slot (or a new segment) of ``nbytes``, and fill it.

        ``fill`` receives a writable memoryview of exactly ``nbytes`` (at
        least 1) and must not keep views of it. It runs in a worker thread when
        the transfer is at least ``OFF_THREAD_BYTES`` (so it must not touch
        trio). A zero-byte transfer gets a 1-byte segment. Waits while
        ``target`` has no free credit. Raises TransferTooLarge when ``nbytes``
        exceeds ``max_transfer_bytes``. On any failure (including
        cancellation) the credit is returned, a one-shot segment removed, and
        a slot returned to the pool (or retired if ``fill`` kept a view).
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
        try:
            if self._closed:
                raise trio.ClosedResourceError("shm relay is closed")
            slot = await self._take_slot(size)
            if slot is not None:
                put = await self._put_pooled(slot, target, size, fill)
            else:
                put = await self._put_one_shot(size, fill)
        except BaseException:
            sem.release()
            raise
        # No checkpoint between the fill and this registration: a put that
        # returned is always tracked, so settle/aclose can clean it up.
        self._outstanding[put.name] = (target, put)
        return put

    async def _put_one_shot(self, size: int, fill: Callable[[memoryview], None]) -> ShmPut:
        name = self._next_name()
        path = os.path.join(SHM_DIR, name)
        # A failed creation or fill removes its own file (only that one); a cancelled
        # thread call has not started it, a started one is not abandoned.
        if size >= OFF_THREAD_BYTES:
            identity = await trio.to_thread.run_sync(_create_and_fill, path, size, fill)
        else:
            identity = _create_and_fill(path, size, fill)
        return ShmPut(name=name, size=size, identity=identity)

    async def _put_pooled(self, slot: _Slot, target: str, size: int, fill: Callable[[memoryview], None]) -> ShmPut:
        try:
            if size >= OFF_THREAD_BYTES:
                await trio.to_thread.run_sync(_fill_slot, slot.mm, size, fill, slot.name)
            else:
                _fill_slot(slot.mm, size, fill, slot.name)
        except BufferError:
            self._retire(slot)  # the fill kept a view: never lend this slot again
            raise
        except BaseException:
            self._free(slot)
            raise
        if self._closed:  # closed while a worker thread filled it
            self._retire(slot)
            raise trio.ClosedResourceError("shm relay is closed")
        slot.lease = next(self._leases)
        slot.target = target
        slot.acked = slot.released = False
        return ShmPut(name=slot.name, size=size, segment_size=slot.size, lease=slot.lease)

    async def _take_slot(self, size: int) -> _Slot | None:
        """A free pooled slot for ``size`` bytes, marked busy; None: use a one-shot segment."""
        wanted = slot_size(size)
        if wanted > self.pool_bytes // 2:
            return None
        free = [s for s in self._slots.values() if not s.busy]
        for slot in free:
            if slot.size == wanted:
                slot.busy = True
                slot.used = next(self._uses)
                return slot
        # Make room for a new slot by evicting free slots of other sizes, oldest first.
        free.sort(key=lambda s: s.used)
        while self._pooled_bytes + wanted > self.pool_bytes and free:
            self._retire(free.pop(0))
        if self._pooled_bytes + wanted > self.pool_bytes:
            return None  # the pool is lent out: fall back
        self._pooled_bytes += wanted  # reserved while the slot is created
        name = f"{self.prefix}-p{next(self._counter)}"
        path = os.path.join(SHM_DIR, name)
        try:
            if wanted >= OFF_THREAD_BYTES:
                mm, identity = await trio.to_thread.run_sync(_create_slot, path, wanted)
            else:
                mm, identity = _create_slot(path, wanted)
        except ShmError:
            self._pooled_bytes -= wanted
            return None  # /dev/shm is full, or the name is taken: a one-shot segment may still fit
        except BaseException:
            self._pooled_bytes -= wanted  # a failed creation removed its own file
            raise
        if self._closed:
            self._pooled_bytes -= wanted
            _unlink_own(path, identity)
            raise trio.ClosedResourceError("shm relay is closed")
        slot = _Slot(name=name, size=wanted, mm=mm, identity=identity, busy=True, used=next(self._uses))
        self._slots[name] = slot
        return slot

    def _free(self, slot: _Slot) -> None:
        """Back to the pool: no receiver reads the slot now (nor the sender, unless it still holds it)."""
        slot.busy = slot.held
        slot.lease = -1
        slot.target = ""

    def _retire(self, slot: _Slot) -> None:
        """Forget and unlink a slot; a receiver still mapping it keeps valid memory."""
        if self._slots.pop(slot.name, None) is None:
            return
        self._pooled_bytes -= slot.size
        _unlink_own(os.path.join(SHM_DIR, slot.name), slot.identity)
        # The mapping is not closed explicitly: dropping the last reference
        # unmaps it, unless a view a fill leaked still holds it.
        slot.busy = True

    def settle(self, put: ShmPut, success: bool, *, keep_credit: bool = False) -> bool:
        """Finish a transfer as its ACK says: return its credit; clean up on failure.

        Call it when the receiver's ACK arrives (``success`` as ACKed), or
        with ``success=False`` on ACK timeout or the request's abort. With
        ``keep_credit`` (a successful ACK whose receiver has yet to consume
        the object) the credit stays taken: hand it back later with
        :meth:`return_credit`. Returns whether this call settled the put.

        One-shot: after a successful ACK the receiver has already unlinked the
        segment; we unlink again anyway (a no-op then) so that a receiver that
        ACKed without reading cannot leak it. After a failure it is ours to
        remove. Pooled: a success marks the slot read; it returns to the pool
        once released too (:meth:`release`). A failure retires the slot
        (unless the receiver already released it), since the receiver may or
        may not hold views of it. Idempotent (a settle of an older put of the
        same slot is ignored).
        """
        entry = self._outstanding.get(put.name)
        if entry is None or entry[1] != put:
            return False
        del self._outstanding[put.name]
        target, _ = entry
        if not put.pooled:
            # Names are never reused, and only the file we created goes: a name
            # the receiver freed and someone planted again is left alone.
            _unlink_own(os.path.join(SHM_DIR, put.name), put.identity)
        else:
            slot = self._slots.get(put.name)
            if slot is not None and slot.busy and slot.lease == put.lease:
                if slot.released:
                    self._free(slot)
                elif success:
                    slot.acked = True
                else:
                    self._retire(slot)
        if not (keep_credit and success):
            self._credits[target].release()
        return True

    def return_credit(self, target: str) -> None:
        """Give back a credit of ``target`` that :meth:`settle` kept (``keep_credit``); once per kept credit."""
        self._credits[target].release()

    def release(self, name: str, lease: int, receiver: str) -> bool:
        """The receiver ``receiver`` no longer views slot ``name`` of ``lease``: the slot may be reused.

        Returns the slot to the pool if its transfer was ACKed already, else
        remembers the release for :meth:`settle`. Ignored (returns False) for
        an unknown slot, a lease the slot does not carry any more, another
        receiver, or a repeated release.
        """
        slot = self._slots.get(name)
        if slot is None or not slot.busy or slot.lease != lease or slot.target != receiver or slot.released:
            return False
        slot.released = True
        if slot.acked:
            self._free(slot)
        return True

    # ------------------------------------------------ slots a stage writes into (omni_trio.comm.alloc)

    async def hold(self, nbytes: int) -> tuple[str, mmap.mmap] | None:
        """Take a pooled slot of at least ``nbytes`` for the sender to build its output in; None: no room.

        The slot stays out of the pool until :meth:`unhold`; :meth:`lend` sends it without a copy.
        Returns its name and the relay's mapping of it.
        """
        if self._closed or nbytes > self.max_transfer_bytes:
            return None
        slot = await self._take_slot(max(nbytes, 1))
        if slot is None:
            return None
        slot.held = True
        return slot.name, slot.mm

    def unhold(self, name: str) -> None:
        """The sender no longer views held slot ``name``: it returns to the pool once no receiver does either."""
        slot = self._slots.get(name)
        if slot is None or not slot.held:
            return
        slot.held = False
        if slot.lease == -1:
            self._free(slot)

    async def lend(self, name: str, target: str, length: int) -> ShmPut | None:
        """Send the first ``length`` bytes of held slot ``name`` to ``target`` as they are (no copy).

        Takes a credit of ``target`` like :meth:`put`, and the put is settled and released the same
        way. None (nothing taken) when the slot is not held or is lent already (a second send of the
        same tensor while the first receiver may still view it): the caller copies instead.
        """
        slot = self._slots.get(name)
        if slot is None or not slot.held or slot.lease != -1 or not 1 <= length <= slot.size:
            return None
        # Marked before waiting for the credit, so a concurrent lend of the same slot copies instead.
        slot.lease = lease = next(self._leases)
        slot.target = target
        sem = self._semaphore(target)
        try:
            await sem.acquire()
        except BaseException:
            if self._slots.get(name) is slot and slot.lease == lease:
                self._free(slot)  # back to held (or to the pool, if the sender let go meanwhile)
            raise
        if self._closed or self._slots.get(name) is not slot or slot.lease != lease:
            sem.release()
            raise trio.ClosedResourceError("shm relay is closed")
        slot.acked = slot.released = False
        put = ShmPut(name=name, size=length, segment_size=slot.size, lease=lease)
        self._outstanding[name] = (target, put)
        return put

    def in_use(self, target: str | None = None) -> int:
        """Outstanding (put, not settled) transfers, across targets or for one."""
        if target is None:
            return len(self._outstanding)
        return sum(1 for t, _ in self._outstanding.values() if t == target)

    def outstanding(self) -> list[ShmPut]:
        """The puts not settled yet, oldest first."""
        return [put for _, put in self._outstanding.values()]

    def pool_stats(self) -> dict[str, int]:
        """The pool right now: ``slots``, ``free``, ``lent`` (not free) and ``bytes`` (all slots)."""
        free = sum(1 for s in self._slots.values() if not s.busy)
        return {"slots": len(self._slots), "free": free, "lent": len(self._slots) - free, "bytes": self._pooled_bytes}

    def slot_names(self) -> list[str]:
        """The names of every pooled segment that exists."""
        return list(self._slots)

    async def aclose(self) -> None:
        """Settle every outstanding put as failed, unlink every slot, refuse further puts. Idempotent."""
        self._closed = True
        for put in self.outstanding():
            self.settle(put, False)
        for slot in list(self._slots.values()):
            self._retire(slot)
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ShmRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


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
        _check_name(name)
        if prefix is not None and not name.startswith(prefix + "-"):
            raise ValueError(f"shared-memory segment {name!r} does not belong to prefix {prefix!r}")
        for what, value in (("segment size", segment_size), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"invalid shared-memory {what} {value!r}")
        if length > segment_size:
            raise ValueError(f"length {length} exceeds the segment size {segment_size}")
        path = _segment_path(name)
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
                mm, st = await trio.to_thread.run_sync(_open_mapped, path, name, segment_size, flags)
            else:
                await trio.lowlevel.checkpoint()
                mm, st = _open_mapped(path, name, segment_size, flags)
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
