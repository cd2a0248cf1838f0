"""Helpers for the multi-process tests: configs with a known IPC base directory,
and what a run may leave behind (IPC directories, shared memory, worker processes)."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.control.sockets.framing import message_head
from omni_trio.control.wire.auth import FrameMac
from omni_trio.runtime import pipeline

#: Where POSIX shared-memory segments live, and the prefix of every omni-trio segment.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "omnitrio-"


def config(base: Path, *stages: ot.StageConfig, **kwargs: Any) -> ot.PipelineConfig:
    """A PipelineConfig whose per-run IPC directory is created under ``base``."""
    return ot.PipelineConfig(stages=list(stages), endpoints=ot.EndpointsConfig(base_path=str(base)), **kwargs)


def ipc_dir(base: Path) -> Path:
    """The one per-run IPC directory (``omnitrio-<name>-XXXX``) of the pipeline running under ``base``."""
    (found,) = base.glob("omnitrio-*")
    return found


def ipc_dirs(base: Path) -> list[str]:
    """Names of the IPC directories under ``base``."""
    return sorted(p.name for p in base.glob("omnitrio-*"))


def shm_segments() -> set[str]:
    """omni-trio shared-memory segments that exist now."""
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


def descendants(of: int | None = None) -> dict[int, tuple[str, str]]:
    """The processes descended from ``of`` (this process by default): pid -> (state, command line).

    Descendants, not only children: workers forked by a pipeline's template process
    are its children, the template is ours.
    """
    root = os.getpid() if of is None else of
    known: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        known[int(entry)] = (int(fields[1]), fields[0], cmdline)
    found: dict[int, tuple[str, str]] = {}
    parents = {root}
    while parents:
        children = {pid for pid, (ppid, _, _) in known.items() if ppid in parents and pid not in found}
        found.update({pid: known[pid][1:] for pid in children})
        parents = children
    return found


def workers_of(parent: int) -> set[int]:
    """Worker processes (``python -m omni_trio.runtime.workers.worker``) descended from ``parent``.

    Descendants, not children: workers forked by the pipeline's template are the template's children.
    """
    return {pid for pid, (_, cmd) in descendants(parent).items() if "omni_trio.runtime.workers.worker" in cmd}


def templates_of(parent: int) -> set[int]:
    """Template processes (``python -m omni_trio.runtime.workers.template_main``) descended from ``parent``."""
    return {pid for pid, (_, cmd) in descendants(parent).items() if "omni_trio.runtime.workers.template_main" in cmd}


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has: only its status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def worker_processes() -> dict[int, str]:
    """Worker processes (``omni_trio.runtime.workers.worker``) descended from this process that still exist."""
    return {pid: cmd for pid, (_, cmd) in descendants().items() if "omni_trio.runtime.workers.worker" in cmd}


def template_processes() -> dict[int, str]:
    """Template processes (``omni_trio.runtime.workers.template_main``, see omni_trio.runtime.workers.launch)
    of this process that still exist."""
    return {pid: cmd for pid, (_, cmd) in descendants().items() if "omni_trio.runtime.workers.template_main" in cmd}


def zombie_children() -> list[int]:
    """Children of this process or of a pipeline's template that exited but were never waited for.

    Only ours and the templates': other descendants (a Ray cluster's processes, say) reap their own.
    """
    parents = {os.getpid(), *template_processes()}
    return [pid for pid in descendants() if _zombie_of(pid, parents)]


def _zombie_of(pid: int, parents: set[int]) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] == "Z" and int(fields[1]) in parents


async def wait_stats(
    pipeline: ot.Pipeline, within_s: float, done: Callable[[ot.PipelineStats], bool]
) -> ot.PipelineStats:
    """``stats()`` once ``done(stats)`` (bounded polling: what it waits for happens in worker processes)."""
    with trio.fail_after(within_s):
        while not done(stats := await pipeline.stats()):
            await trio.sleep(0.05)
    return stats


async def wait_for_file(path: Path, timeout: float = 20.0) -> str:
    """The content of ``path`` once it exists (bounded polling: a child process writes it)."""
    file = trio.Path(path)
    with trio.fail_after(timeout):
        while not await file.exists():
            await trio.sleep(0.01)
    return await file.read_text()


async def submit_and_kill(
    pipeline: ot.Pipeline, request_id: str, pid_file: Path, *, returncode: int | None = -signal.SIGKILL
) -> int:
    """Submit ``request_id`` (it blocks in the blocker stage of process ``p_block``, which writes its pid to
    ``pid_file``), SIGKILL that process once it holds the request, and check that the request fails with
    StageProcessDied naming that process, its pid and ``returncode``; return the pid.

    The pid is not checked to be a descendant of ours: a worker forked by a template that died is
    reparented to init (its exit status is then unknown: ``returncode=None``)."""
    failed: list[ot.StageProcessDied] = []

    async def submit() -> None:
        with pytest.raises(ot.StageProcessDied) as died:
            await pipeline.submit(request_id, "x", params={"pid_file": str(pid_file)})
        failed.append(died.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit)
        pid = int(await wait_for_file(pid_file))
        os.kill(pid, signal.SIGKILL)
    (error,) = failed
    assert (error.request_id, error.process, error.pid, error.returncode) == (request_id, "p_block", pid, returncode)
    return pid


def kill_workers(keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Kill and reap worker processes of this process (other than ``keep``), then its
    template processes (which reap the workers they forked); return their pids.

    For tests that expect a runtime bug to leave workers behind: they clean up
    themselves, so that the autouse check does not report the same bug again.
    """
    killed = []
    for pid in [*sorted(worker_processes()), *sorted(template_processes())]:
        if pid in keep:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        with contextlib.suppress(ChildProcessError):  # a forked worker is its template's to reap
            os.waitpid(pid, 0)
        killed.append(pid)
    return killed


def _spec(ipc: Path) -> Any:
    with open(next(ipc.glob("*.spec")), "rb") as handle:
        return pickle.load(handle)


def run_prefix(ipc: Path) -> str:
    """The shared-memory name prefix of the run whose IPC directory is ``ipc``
    (receivers accept only segments named under it), read from a worker's spec file."""
    return str(_spec(ipc).shm_prefix).rsplit("-", 1)[0]  # "<run prefix>-<process index>"


def run_auth(ipc: Path) -> FrameMac:
    """The authenticator of the run whose IPC directory is ``ipc``, from the secret in a worker's
    spec file (a process that reads the run's files can seal messages; one that can only connect cannot)."""
    return FrameMac(_spec(ipc).secret)


@contextlib.contextmanager
def nothing_left_behind(base: Path) -> Iterator[None]:
    """Fail if the block leaves an IPC directory under ``base``, a shared-memory
    segment of one of its pipelines, a worker or template process or an unwaited child.

    Shared memory: other test runs may use /dev/shm at the same time, so only
    the segments of pipelines started here count. Their names start with the
    run's prefix, which the runtime passes to ``remove_segments`` when the
    pipeline ends; the check records it there (and still removes the segments).
    Whatever is left is removed (workers killed) before failing, so that one
    failing test does not fail the next ones.
    """
    prefixes: list[str] = []
    real_remove = pipeline.remove_segments

    def remove_segments(prefix: str) -> list[str]:
        prefixes.append(prefix)
        return real_remove(prefix)

    workers_before = set(worker_processes()) | set(template_processes())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "remove_segments", remove_segments)
        yield
    problems = []
    if dirs := ipc_dirs(base):
        problems.append(f"IPC directories left under {base}: {dirs}")
    left = sorted(name for name in shm_segments() if name.startswith(tuple(f"{p}-" for p in prefixes)))
    if left:
        problems.append(f"shared-memory segments left in /dev/shm: {left}")
        for name in left:
            with contextlib.suppress(OSError):
                os.unlink(SHM_DIR / name)
    workers = {pid: cmd for pid, cmd in worker_processes().items() if pid not in workers_before}
    templates = {pid: cmd for pid, cmd in template_processes().items() if pid not in workers_before}
    if workers:
        problems.append(f"worker processes still running: {workers}")
    if templates:
        problems.append(f"template processes still running: {templates}")
    if workers or templates:
        kill_workers(keep=workers_before)
    if zombies := zombie_children():
        problems.append(f"child processes never waited for: {zombies}")
        for pid in zombies:  # ours are reaped here (a template's are its own), or every later test fails
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
    assert not problems, "\n".join(problems)


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send this process's fd 2, and so its workers' stderr, to ``path`` (appended, never truncated).

    For a test that reads the workers' log while they run. Not capfd: its readouterr() truncates
    the capture file while the workers keep writing to it, so a line a worker writes between the
    read and the truncation is lost.
    """
    saved = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(log, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


class RawPush:
    """A peer of a process's inbox from outside the run: a plain Unix stream socket that sends frames
    in the link's wire format as they are (no proof unless the caller seals them)."""

    def __init__(self, path: Path) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))

    async def send_multipart(self, frames: list[bytes]) -> None:
        """Write one message, whole (waits while the inbox's socket buffer is full)."""
        await self.stream.send_all(message_head([len(frame) for frame in frames]) + b"".join(frames))

    async def wait_disconnected(self) -> None:
        """Return once the inbox closed this connection."""
        with contextlib.suppress(trio.BrokenResourceError):
            while await self.stream.receive_some(1):
                pass

    def close(self) -> None:
        """Close the connection."""
        self.stream.socket.close()
