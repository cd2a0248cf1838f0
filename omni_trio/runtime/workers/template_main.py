"""``python -m omni_trio.runtime.workers.template_main``: the preloaded template that forks worker processes.

A pipeline's :class:`~omni_trio.runtime.workers.launch.TemplateLauncher` starts one of
these with one end of a private ``SOCK_SEQPACKET`` socket pair as its stdin.
The template imports omni_trio's worker code and the pipeline's stage
modules (torch with them, where they import it) once, checks that it is
still safe to fork (one Python thread, no zmq or CUDA threads, CUDA not
initialised: it never touches CUDA itself), says so, and then forks one
worker per request. So N workers cost about one import instead of N.

The template stays single-threaded and never creates a zmq context or a
trio loop: a forked child starts its own. Requests carry three descriptors
(SCM_RIGHTS): the read end of the caller's pipe, which becomes the
worker's stdin (its EOF still means "the pipeline's process is gone"), and
the caller's current stdout and stderr, so a worker writes where a spawned
one would. The reply carries the worker's pid and a pidfd for it. The
template reaps its workers and reports each exit status; it exits when
the caller's end of the socket closes.

Nothing in the package imports this module: ``-m`` runs it fresh.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import selectors
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from omni_trio.runtime.heap import freeze_startup_heap
from omni_trio.runtime.workers.template import LAUNCH_FDS, MAX_MESSAGE

#: Native threads whose owners do not survive a fork (zmq's I/O threads, CUDA's driver threads).
UNSAFE_THREAD_PREFIXES = ("ZMQbg", "cuda")


def send(sock: socket.socket, message: tuple[Any, ...], fds: list[int] | None = None) -> None:
    """Send one message (and descriptors) on a blocking socket."""
    socket.send_fds(sock, [pickle.dumps(message)], fds or [])


def fork_problem() -> str | None:
    """Why forking this process now would be unsafe, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running (a stage module started a thread at import)"
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm", encoding="utf-8", errors="replace") as handle:
            name = handle.read().strip()
        if name.startswith(UNSAFE_THREAD_PREFIXES):
            return f"native thread {name!r} is running (a zmq context or CUDA was created at import)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a query: it initialises nothing
        return "CUDA was initialised at import"
    return None


def preload(modules: list[str]) -> dict[str, str]:
    """Import ``modules``; return those that failed, with why (a worker reports it properly itself)."""
    skipped = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the worker imports it again and reports the traceback
            skipped[name] = f"{type(exc).__name__}: {exc}"
    return skipped


def set_title(argv: list[str]) -> None:
    """Make ``/proc/self/cmdline`` (what ps shows) read ``argv``, within the room our own argv left."""
    with open("/proc/self/stat", encoding="ascii", errors="replace") as handle:
        stat = handle.read()
    fields = stat[stat.rfind(")") + 2 :].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, proc(5) fields 48 and 49
    title = b"\0".join(arg.encode() for arg in argv)[: end - start - 1]
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, title, len(title))


def _become_worker(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: take over the request's stdio and run the worker; never returns."""
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        with contextlib.suppress(OSError, ValueError, IndexError):  # cosmetic: ps and tests read it
            set_title(request["title"])
        sys.argv = request["title"][2:]  # as ``-m omni_trio.runtime.workers.worker SPEC`` would have it
        from omni_trio.runtime.workers.worker import main

        main([request["spec"]])  # exits the process itself
    except BaseException:  # noqa: BLE001 - the exit status tells the caller; the traceback says why
        traceback.print_exc()
    finally:
        os._exit(1)


class Template:
    """The template's loop: fork on request, report exits, end with the caller."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._selector = selectors.DefaultSelector()
        self._selector.register(sock, selectors.EVENT_READ)
        #: Our own pidfd of each live worker, which says when to reap it.
        self._pidfds: dict[int, int] = {}

    def serve(self) -> None:
        """Answer requests until the caller's end closes."""
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is self._sock:
                    if not self._on_request():
                        return
                else:
                    self._reap(key.data)

    def _on_request(self) -> bool:
        message, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, LAUNCH_FDS)
        if not message:
            return False
        request = pickle.loads(message)
        try:
            problem = fork_problem()
            if problem is not None or len(fds) != LAUNCH_FDS:
                send(self._sock, ("failed", problem or f"expected {LAUNCH_FDS} descriptors, got {len(fds)}"))
                return True
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                send(self._sock, ("failed", f"fork failed: {exc}"))
                return True
            if pid == 0:
                self._leave()
                _become_worker(request, fds)
            pidfd = os.pidfd_open(pid)
            self._pidfds[pid] = pidfd
            self._selector.register(pidfd, selectors.EVENT_READ, pid)
            send(self._sock, ("launched", pid), [pidfd])
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _leave(self) -> None:
        """In a forked child: drop the template's descriptors (a worker holds only its own)."""
        self._selector.close()
        self._sock.close()
        for pidfd in self._pidfds.values():
            os.close(pidfd)

    def _reap(self, pid: int) -> None:
        pidfd = self._pidfds.pop(pid)
        self._selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        send(self._sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def main() -> None:
    """Entry point (started by :class:`~omni_trio.runtime.workers.launch.TemplateLauncher`, stdin is its socket)."""
    # The caller handles Ctrl-C for the whole pipeline, like the workers do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        _run()
    except BaseException:  # noqa: BLE001 - the caller sees the exit status; stderr says why
        traceback.print_exc()
        code = 1
    # A hard exit: finalising torch and the rest at interpreter shutdown takes most of a second.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run() -> None:
    sock = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    message, _, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 0)
    if not message:
        return
    setup = pickle.loads(message)
    sys.path[:0] = [p for p in setup["sys_path"] if p not in sys.path]
    skipped = preload(setup["modules"])
    problem = fork_problem()
    if problem is not None:
        send(sock, ("unsafe", problem))
        return
    # Before the first fork: every worker inherits the imports frozen (runtime/heap.py).
    freeze_startup_heap()
    send(sock, ("ready", skipped))
    Template(sock).serve()


if __name__ == "__main__":
    main()
