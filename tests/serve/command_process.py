"""``omni-trio serve CONFIG`` run as a subprocess, as a user runs it: started, read, stopped, cleaned up.

Shared by the tests of the serve command: :func:`serving` starts it in a directory of its own (the
run's IPC directory goes there), waits for its one ``listening on`` line, and on the way out kills
whatever of it is left, so that a failing test leaves no process behind; :func:`left_behind` says what
a finished run left in that directory and in ``/dev/shm``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    """``pid``'s child processes (per thread: trio starts child processes from a worker thread)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):
            found.update(int(p) for p in (task / "children").read_text().split())
    return found


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (workers are forked by the template process, the server's child)."""
    found, parents = set(), {pid}
    while parents:
        parents = set().union(*(children(parent) for parent in parents)) - found
        found |= parents
    return found


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ('' once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except FileNotFoundError:
        return ""


def workers(pid: int) -> set[int]:
    """The worker processes below ``pid``."""
    return {p for p in descendants(pid) if "omni_trio.runtime.workers.worker" in cmdline(p)}


@attrs.define
class Served:
    """A running ``omni-trio serve``: its process, its URL, its workers and its run's segment prefix."""

    process: subprocess.Popen[str]
    url: str = ""
    workers: set[int] = attrs.field(factory=set)
    run_prefix: str = ""


@contextlib.contextmanager
def serving(config: Path, directory: Path, spec_of: str, *options: str) -> Iterator[Served]:
    """Run ``omni-trio serve config --port 0 [options]`` in ``directory`` until the block ends.

    ``spec_of`` names a worker process whose spec file gives the run's segment prefix.
    """
    env = {**os.environ, "TMPDIR": str(directory)}  # the run's IPC directory goes here
    process = subprocess.Popen(
        [sys.executable, "-m", "omni_trio", "serve", str(config), "--port", "0", "--app-dir", str(ROOT), *options],
        cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    served = Served(process)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # bounded by the pipeline's start-up timeout
        if not line.startswith("listening on http://127.0.0.1:"):
            process.wait(30)
            stderr = process.stderr.read() if process.stderr else None
            raise AssertionError(f"no listening line: {line!r}; stderr: {stderr}")
        served.url = line.split()[-1]
        served.workers = workers(process.pid)
        spec = pickle.loads(next(directory.glob(f"omnitrio-*/{spec_of}.spec")).read_bytes())
        served.run_prefix = spec.shm_prefix.rsplit("-", 1)[0]
        yield served
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        for pid in descendants(process.pid) | served.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def left_behind(served: Served, directory: Path) -> list[str]:
    """What the finished run left: live workers, IPC directories in ``directory``, segments in /dev/shm."""
    alive = [f"worker {pid}" for pid in served.workers if "omni_trio" in cmdline(pid)]
    dirs = [str(path) for path in directory.glob("omnitrio-*")]
    segments = [name for name in os.listdir("/dev/shm") if served.run_prefix and name.startswith(served.run_prefix)]
    return alive + dirs + segments
