"""Segment files in ``/dev/shm``: their names, creation, opening and owner-only removal.

Every segment of a relay is named from a caller-chosen prefix (the run's,
see :mod:`omni_trio.comm.ownership`, then the process and relay numbers):
one-shot segments ``<prefix>-<n>`` and pooled slots ``<prefix>-p<n>``, so
:func:`remove_segments` removes both kinds after a crash and
:func:`is_pooled_slot` tells them apart.

Why not ``multiprocessing.shared_memory``: its resource tracker registers
every segment in the creating *and* every attaching process and "cleans up"
(unlinks) segments another process still needs, with warnings at exit. Plain
``os.open`` + ``mmap`` has no tracker; leftovers
after a crash are removed by the supervisor with :func:`remove_segments`.

Only the owner removes a segment: every unlink here checks that the name is
a regular file of our effective uid and, where we created or opened it, the
very same file (device and inode); a name that is taken when we create a
segment raises :class:`SegmentExists` and the file is left alone.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import stat
import threading

from omni_trio.errors import OmniTrioError

__all__ = [
    "OFF_THREAD_BYTES",
    "SHM_DIR",
    "Identity",
    "SegmentExists",
    "SegmentNotFound",
    "ShmError",
    "check_name",
    "check_prefix",
    "check_size",
    "create_mapped",
    "freeze_creation",
    "identity_of",
    "is_pooled_slot",
    "open_mapped",
    "remove_segments",
    "segment_path",
    "unlink_own",
]

#: Where POSIX shared-memory segments live on Linux.
SHM_DIR = "/dev/shm"
#: Segments at least this large are created/filled/read in a worker thread.
OFF_THREAD_BYTES = 1024 * 1024

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


class SegmentNotFound(ShmError, FileNotFoundError):
    """A segment to read is missing or does not have the announced size."""


class SegmentExists(ShmError, FileExistsError):
    """A segment name to create is taken by a file we did not create (stale or planted): it is left alone."""


def check_name(name: str, prefix: str | None = None) -> str:
    """``name`` if it is one plain path component (and, given ``prefix``, one of its segments); else ValueError.

    ``prefix`` is the defence against a hostile name pointing at another run's segments.
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"invalid shared-memory segment name {name!r}")
    if prefix is not None and not name.startswith(prefix + "-"):
        raise ValueError(f"shared-memory segment {name!r} does not belong to prefix {prefix!r}")
    return name


def check_size(value: int, what: str = "segment size") -> int:
    """``value`` if it is a positive int (a bool is not one); else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"invalid shared-memory {what} {value!r}")
    return value


def segment_path(name: str) -> str:
    """The path of segment ``name`` (a checked name) in SHM_DIR."""
    return os.path.join(SHM_DIR, check_name(name))


def identity_of(st: os.stat_result) -> Identity:
    """Which file ``st`` describes: its device and inode."""
    return st.st_dev, st.st_ino


def unlink_own(path: str, identity: Identity | None = None) -> bool:
    """Unlink ``path`` if it is a regular file of our effective uid and, given ``identity``, the
    very file we created or opened; a name another user or run planted or replaced is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        return False
    if identity is not None and identity_of(st) != identity:
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


def create_mapped(path: str, size: int, flags: int) -> tuple[mmap.mmap, Identity]:
    """Create segment ``path`` of ``size`` bytes with its pages reserved, and map it."""
    # O_EXCL: never adopt an existing file (a stale or planted one), and never
    # remove it either; it also refuses to follow a symlink at that name.
    with _CREATION:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except FileExistsError as exc:
            raise SegmentExists(f"shared-memory segment {os.path.basename(path)} exists already; left alone") from exc
    identity = identity_of(os.fstat(fd))
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
        unlink_own(path, identity)
        raise


def open_mapped(path: str, name: str, size: int, flags: int) -> tuple[mmap.mmap, os.stat_result]:
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


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can start segment names; else ValueError."""
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
    pattern = re.compile(re.escape(check_prefix(prefix)) + r"(?:-[0-9]+)*-p?[0-9]+")
    removed: list[str] = []
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if pattern.fullmatch(name) and unlink_own(os.path.join(SHM_DIR, name)):
            removed.append(name)
    return sorted(removed)
