"""Who owns a run's IPC directory and shared-memory segments; reclaiming what dead runs left.

A run belongs to its *owner*, the process that called ``open_pipeline``. The
owner is identified by its pid, its start time (``/proc/PID/stat`` field 22,
so that a reused pid is not mistaken for it) and its pid namespace (a process
in another container sharing ``/dev/shm`` has pids we cannot check). Both
records of a run carry that identity:

* every segment name starts with the run prefix
  ``omnitrio-<pid>.<start>.<pidns>.<token>`` (:func:`new_run_prefix`);
* the IPC directory holds an ``owner`` file (:func:`write_owner_record`) with
  the same fields, the boot id (the directory outlives a reboot, ``/dev/shm``
  does not) and the run prefix.

A worker that joins a run from another host (the ``manual`` and ``ray``
launchers) keeps a private directory of its own there: its ``owner`` file
names the worker itself and the worker's own segment prefix
(``<run prefix>-<index>``), so that a worker killed there leaves nothing that
``omni-trio reclaim`` on its host cannot remove, while the rest of the run
(which may share that ``/dev/shm``) is left alone.

A run is *provably dead* when its owner's pid names no process in our pid
namespace, or a process with another start time, or a zombie; and only then
does :func:`reclaim_dead_runs` remove its leftovers, and only those files that
belong to our effective uid (a name another user planted is never touched).
Anything that cannot be proven (no owner record, an unreadable one, another
namespace or boot, an old-style name) is left alone.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

import attrs

from omni_trio.comm.segments import SHM_DIR, remove_segments

#: The file in a run's IPC directory that names its owner.
OWNER_FILE = "owner"
#: The names of IPC directories (``mkdtemp`` adds a random tail) and the prefix of every run prefix.
RUN_NAME_PREFIX = "omnitrio-"
_RUN_PREFIX_RE = re.compile(r"omnitrio-([0-9]+)\.([0-9]+)\.([0-9]+)\.[0-9a-f]+")


@attrs.frozen
class Owner:
    """The identity of a run's owner process."""

    pid: int
    start: int
    pidns: int

    @classmethod
    def current(cls) -> Owner | None:
        """This process, or None where ``/proc`` cannot tell (then nothing is ever reclaimed)."""
        pid = os.getpid()
        start = start_time(pid)
        pidns = pid_namespace()
        return None if start is None or pidns is None else cls(pid, start, pidns)

    def alive(self) -> bool:
        """False only when the owner is provably gone: other namespace counts as alive (unprovable)."""
        if self.pidns != pid_namespace():
            return True
        return start_time(self.pid) == self.start


def start_time(pid: int) -> int | None:
    """Process ``pid``'s start time in clock ticks since boot; None if there is no such live process.

    A zombie counts as gone: it has exited, only its exit status waits for its parent.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    rest = fields[fields.rfind(")") + 2 :].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def pid_namespace() -> int | None:
    """The inode of this process's pid namespace, or None if ``/proc`` does not show it."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def boot_id() -> str:
    """This boot's id (empty where the kernel does not tell)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def new_run_prefix() -> str:
    """A fresh run prefix naming this process as the owner (``omnitrio-<pid>.<start>.<pidns>.<token>``)."""
    owner = Owner.current()
    token = secrets.token_hex(6)
    if owner is None:
        return f"{RUN_NAME_PREFIX}0.0.0.{token}"  # pid 0 is never a live process, but never provably dead either
    return f"{RUN_NAME_PREFIX}{owner.pid}.{owner.start}.{owner.pidns}.{token}"


def owner_of_prefix(run_prefix: str) -> Owner | None:
    """The owner a run prefix names, or None for a name not made by :func:`new_run_prefix`."""
    match = _RUN_PREFIX_RE.fullmatch(run_prefix)
    if match is None or match.group(1) == "0":
        return None
    pid, start, pidns = (int(group) for group in match.groups())
    return Owner(pid, start, pidns)


def write_owner_record(ipc_dir: Path, run_prefix: str, owner: Owner | None = None) -> None:
    """Record in ``ipc_dir`` which process owns it and which segments go with it (written whole, or not at all).

    ``owner`` defaults to the owner ``run_prefix`` names (the caller's IPC directory); a joined worker's
    private directory names the worker and its own segment prefix (``<run prefix>-<index>``).
    """
    owner = owner or owner_of_prefix(run_prefix)
    if owner is None:
        return
    record = {**attrs.asdict(owner), "boot": boot_id(), "run_prefix": run_prefix}
    partial = ipc_dir / f".{OWNER_FILE}.partial"
    partial.write_text(json.dumps(record))
    partial.rename(ipc_dir / OWNER_FILE)


def _owned_by_us(st: os.stat_result, kind: int) -> bool:
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid()


def _read_record(ipc_dir: Path) -> tuple[Owner, str] | None:
    """The owner and run prefix recorded in ``ipc_dir``, if the record is ours and of this boot."""
    path = ipc_dir / OWNER_FILE
    try:
        if not _owned_by_us(os.lstat(path), stat.S_IFREG):
            return None
        record = json.loads(path.read_text())
        owner = Owner(int(record["pid"]), int(record["start"]), int(record["pidns"]))
        prefix = str(record["run_prefix"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("boot") != boot_id() or _RUN_PREFIX_RE.match(prefix) is None:
        return None
    return owner, prefix


def remove_run(ipc_dir: Path | None, run_prefix: str) -> list[str]:
    """Remove a run's segments and its IPC directory (only if it is ours); return the segment names removed."""
    removed = remove_segments(run_prefix)
    if ipc_dir is not None:
        try:
            if _owned_by_us(os.lstat(ipc_dir), stat.S_IFDIR):
                shutil.rmtree(ipc_dir, ignore_errors=True)
        except OSError:
            pass
    return removed


@attrs.frozen
class Reclaimed:
    """What :func:`reclaim_dead_runs` removed."""

    directories: list[str]
    segments: list[str]


def reclaim_dead_runs(base_dirs: Iterable[Path]) -> Reclaimed:
    """Remove the IPC directories (under ``base_dirs``) and segments of runs whose owner is provably dead.

    Only files and directories of our effective uid are considered; a run
    whose owner is alive, in another pid namespace or unknown is left alone.
    """
    directories: list[str] = []
    segments: list[str] = []
    dead: set[str] = set()
    for base in dict.fromkeys(Path(b) for b in base_dirs):
        try:
            entries = list(base.glob(f"{RUN_NAME_PREFIX}*"))
        except OSError:
            continue
        for ipc_dir in entries:
            record = _read_record(ipc_dir)
            if record is None or record[0].alive():
                continue
            dead.add(record[1])
            segments += remove_run(ipc_dir, record[1])
            directories.append(str(ipc_dir))
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        names = []
    checked: set[str] = set()  # one look at /proc per run, however many segments it has
    for name in names:
        match = _RUN_PREFIX_RE.match(name)
        if match is None or match.group(0) in checked:
            continue
        prefix = match.group(0)
        checked.add(prefix)
        owner = owner_of_prefix(prefix)
        if prefix not in dead and owner is not None and not owner.alive():
            segments += remove_segments(prefix)
    return Reclaimed(sorted(directories), sorted(segments))
