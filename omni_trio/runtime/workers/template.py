"""The caller's side of a template process (:mod:`omni_trio.runtime.workers.template_main`) and the workers it forks.

:class:`TemplateProcess` starts the template, sends it what to preload,
forks workers through it and reads its reports: launch replies, and each
worker's exit status (the template is their parent and reaps them).
:class:`ForkedProcess` is such a worker as the supervisor sees it: the same
``pid``, ``returncode``, ``wait``, ``terminate``, ``kill`` and ``stdin`` as
a ``trio.Process``. Its death is an awaited event, as for a spawned worker:
the template's exit report, or, if the template itself died, the worker's
pidfd becoming readable (its status is then unknown). Signals go through the
pidfd, so they never reach a recycled pid.
"""

from __future__ import annotations

import array
import contextlib
import os
import pickle
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import trio

from omni_trio.errors import describe_exit
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: Descriptors of one launch request: the worker's stdin, stdout and stderr.
LAUNCH_FDS = 3
#: Wire messages are small pickles (the setup, a request, a reply, an exit report).
MAX_MESSAGE = 1 << 16

#: How long a closed template may take to exit before it is killed (it has nothing left to do).
TEMPLATE_EXIT_S = 5.0
#: How long a fork request may wait for its reply (a fork takes milliseconds) before the template
#: counts as broken and is killed.
FORK_REPLY_S = 30.0


class TemplateDied(Exception):
    """The template process is gone; a new one may be started."""


class ForkedProcess:
    """A worker process forked by a template, with the parts of ``trio.Process`` the supervisor uses."""

    def __init__(self, pid: int, pidfd: int, stdin_fd: int) -> None:
        self.pid = pid
        #: The write end of the worker's stdin pipe: closing it (or our exit) tells the worker to go.
        self._stdin = trio.lowlevel.FdStream(stdin_fd)
        self.stdin: trio.abc.SendStream | None = self._stdin
        self.returncode: int | None = None
        self._pidfd: int | None = pidfd
        self._reported = trio.Event()
        self._orphaned = False
        self._watching = trio.Lock()

    def report(self, returncode: int) -> None:
        """The template reaped this worker: it is gone and this is its exit status."""
        self.returncode = returncode
        self._close_pidfd()
        self._reported.set()

    def orphan(self) -> None:
        """The template died: from now on only the pidfd can say when this worker exits."""
        self._orphaned = True
        self._reported.set()

    async def wait(self) -> int | None:
        """Wait until the worker has exited; its exit status (None if its template died before it)."""
        await self._reported.wait()
        if self._orphaned:
            async with self._watching:  # one task at a time may wait on a descriptor
                if self._pidfd is not None:
                    await trio.lowlevel.wait_readable(self._pidfd)
                    self._close_pidfd()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker, if it has not exited."""
        if self._pidfd is not None:
            # ProcessLookupError: it exited; the template's report is on its way.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self.send_signal(signal.SIGKILL)

    def _close_pidfd(self) -> None:
        """The worker is gone: release its pidfd and its stdin pipe (a restart replaces it)."""
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._stdin.close()


class TemplateProcess:
    """One running template: fork workers from it, one request at a time."""

    def __init__(self, process: trio.Process, sock: trio.socket.SocketType) -> None:
        self.process = process
        self._sock = sock
        self._closing = False
        self._children: dict[int, ForkedProcess] = {}
        #: The write end of the stdin pipe of the worker being launched (one launch at a time).
        self._pending_stdin: int | None = None
        self._replies_in, self._replies = trio.open_memory_channel[tuple[Any, ...]](1)
        self._ready = trio.Event()
        self._problem: str | None = None
        self.dead = trio.Event()

    @classmethod
    async def open(cls, nursery: trio.Nursery, modules: list[str], title_room: int) -> TemplateProcess:
        """Start a template that preloads ``modules``; its reports are read in ``nursery``.

        ``title_room`` is the length of the longest worker command line it must be able
        to show (a forked worker rewrites its inherited command line, see ``set_title``).
        """
        ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omni_trio.runtime.workers.template_main", " " * title_room],
                stdin=theirs.fileno(),
            )
        finally:
            theirs.close()
        template = cls(process, ours)
        await ours.send(pickle.dumps({"sys_path": [p for p in sys.path if p], "modules": modules}))
        nursery.start_soon(template._read)
        return template

    async def wait_ready(self) -> str | None:
        """Wait until the template has preloaded; None if it may fork, else why not."""
        await self._ready.wait()
        return self._problem

    async def fork(self, spec_path: Path) -> ForkedProcess:
        """Fork a worker for ``spec_path``; raise TemplateDied, or RuntimeError if it refused.

        Shielded: a request abandoned half-way would leave its reply to the next one. It is
        bounded all the same: a template that does not answer within FORK_REPLY_S is killed.
        """
        with trio.CancelScope(shield=True), trio.move_on_after(FORK_REPLY_S):
            return await self._fork(spec_path)
        self.process.kill()
        raise TemplateDied(f"the template process (pid {self.process.pid}) did not answer in {FORK_REPLY_S:g} s")

    async def _fork(self, spec_path: Path) -> ForkedProcess:
        read_end, write_end = os.pipe()
        self._pending_stdin = write_end
        title = [sys.executable, "-m", "omni_trio.runtime.workers.worker", str(spec_path)]
        # Our descriptors 1 and 2 now, as a spawned worker would inherit them (not sys.stdout,
        # which a test harness may have replaced); /dev/null where one is closed.
        stdio = [fd if _is_open(fd) else os.open(os.devnull, os.O_WRONLY) for fd in (1, 2)]
        fds = array.array("i", [read_end, *stdio])
        try:
            try:
                await self._sock.sendmsg(
                    [pickle.dumps({"spec": str(spec_path), "title": title})],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)],
                )
            except OSError as exc:
                raise TemplateDied(f"the template process (pid {self.process.pid}) is gone: {exc}") from None
            finally:
                for fd in (read_end, *(fd for fd in stdio if fd > 2)):
                    os.close(fd)
            try:
                reply = await self._replies.receive()
            except trio.EndOfChannel:
                raise TemplateDied(f"the template process (pid {self.process.pid}) died during a launch") from None
        finally:
            if self._pending_stdin is not None:  # no worker took it
                os.close(self._pending_stdin)
                self._pending_stdin = None
        if reply[0] == "failed":
            raise RuntimeError(reply[1])
        return self._children[reply[1]]

    async def _read(self) -> None:
        # Shielded, like the supervisor's exit watchers: a stopping pipeline still needs exit reports.
        with trio.CancelScope(shield=True):
            try:
                while True:
                    data, ancdata, _, _ = await self._sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * LAUNCH_FDS))
                    if not data:
                        break
                    self._on_message(pickle.loads(data), _fds(ancdata))
            except (trio.ClosedResourceError, OSError):
                pass
            await self._on_gone()

    def _on_message(self, message: tuple[Any, ...], fds: list[int]) -> None:
        kind = message[0]
        if kind in ("ready", "unsafe"):
            if kind == "unsafe":
                self._problem = message[1]
            elif message[1]:
                log.debug("template_preload_skipped", pid=self.process.pid, modules=message[1])
            self._ready.set()
        elif kind == "launched":
            pid, stdin = message[1], self._pending_stdin
            assert stdin is not None and len(fds) == 1
            self._pending_stdin = None
            self._children[pid] = ForkedProcess(pid, fds[0], stdin)
            self._replies_in.send_nowait(message)
        elif kind == "failed":
            self._replies_in.send_nowait(message)
        elif kind == "exited":
            child = self._children.pop(message[1], None)
            if child is not None:
                child.report(message[2])

    async def _on_gone(self) -> None:
        self._replies_in.close()
        for child in self._children.values():
            child.orphan()
        self._children.clear()
        returncode = await self.process.wait()
        if not self._ready.is_set():
            exit_ = describe_exit(returncode)
            self._problem = f"the template process (pid {self.process.pid}) {exit_} before it was ready"
            self._ready.set()
        elif not self._closing:
            log.error("launch_template_died", pid=self.process.pid, exit=describe_exit(returncode),
                      effect="workers it started keep running; the next launch starts a new template")
        self.dead.set()

    async def aclose(self) -> None:
        """Stop the template (it exits when our end closes) and wait for it."""
        self._closing = True
        self._sock.close()
        with trio.move_on_after(TEMPLATE_EXIT_S):
            await self.dead.wait()
        if not self.dead.is_set():
            self.process.kill()
            await self.dead.wait()


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)
