"""Worker processes as trio tasks: start in parallel, wait for readiness, notice death, stop.

Each process group runs ``python -m omni_trio.worker SPEC`` (a fresh
interpreter: safe with torch and CUDA). Its exit is an awaited event, not a
poll. Start-up is ready when the worker said ``Ready`` *and* its abort
subscription reached our XPUB socket (so no abort can be missed). Shutdown
is graceful (``Shutdown``, stages drain), then firm (terminate, then kill),
all processes in parallel, never blocking the trio loop.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from omni_trio.config import PipelineConfig
from omni_trio.control import messages as m
from omni_trio.control.endpoint import Endpoint, abort_path
from omni_trio.control.zmq_trio import TrioSocket, bind_xpub
from omni_trio.errors import StageStartupError, describe_exit
from omni_trio.tracing import get_logger, process_trace_path

log = get_logger(__name__)

#: How long stopping workers may drain before they are terminated, then killed.
GRACEFUL_STOP_S = 10.0
FIRM_STOP_S = 5.0


@attrs.frozen
class WorkerSpec:
    """Everything a worker needs, written by the runtime into the private IPC directory."""

    config: PipelineConfig
    process: str
    ipc_dir: str
    shm_prefix: str
    trace_path: str | None
    sys_path: list[str]


@attrs.define(eq=False)
class Worker:
    """One worker process and what we know about it."""

    name: str
    process: trio.Process | None = None
    ready: trio.Event = attrs.field(factory=trio.Event)
    subscribed: trio.Event = attrs.field(factory=trio.Event)
    settled: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    failure: str | None = None

    @property
    def pid(self) -> int | None:
        """The process id (None before it started)."""
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (None while running)."""
        return None if self.process is None else self.process.returncode


def startup_traceback_path(ipc_dir: Path, process: str) -> Path:
    """Where a worker that failed to start leaves its traceback."""
    return ipc_dir / f"{process}.traceback"


class Supervisor:
    """Starts, watches and stops the worker processes of one pipeline."""

    def __init__(
        self,
        config: PipelineConfig,
        *,
        groups: list[str],
        ipc_dir: Path,
        run_prefix: str,
        trace_path: Path | None,
        endpoint: Endpoint,
        on_death: Callable[[Worker], None],
    ) -> None:
        self._config = config
        self._ipc_dir = ipc_dir
        self._run_prefix = run_prefix
        self._trace_path = trace_path
        self._endpoint = endpoint
        self._on_death = on_death
        self.workers = {name: Worker(name) for name in groups}
        self._stopping = False
        self._abort: TrioSocket | None = None
        endpoint.handlers[m.Ready] = self._on_ready

    @property
    def abort_socket(self) -> TrioSocket:
        """The broadcast channel for aborts (bound in :meth:`start`)."""
        assert self._abort is not None
        return self._abort

    def live_workers(self) -> list[Worker]:
        """Workers that have not exited."""
        return [w for w in self.workers.values() if not w.exited.is_set()]

    async def spawn(self, nursery: trio.Nursery) -> None:
        """Start every worker; they initialise in parallel (see :meth:`wait_ready`)."""
        xpub = bind_xpub(self._endpoint.context, abort_path(self._ipc_dir))
        self._abort = xpub
        self._endpoint.adopt(xpub)
        nursery.start_soon(self._watch_subscriptions, xpub)
        for index, worker in enumerate(self.workers.values(), start=1):
            spec_path = self._write_spec(worker.name, f"{self._run_prefix}-{index}")
            worker.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "omni_trio.worker", str(spec_path)], stdin=subprocess.PIPE
            )
            nursery.start_soon(self._watch_exit, worker)

    async def wait_ready(self, timeout: float) -> None:
        """Wait until every worker is ready; raise StageStartupError naming those that are not."""
        with trio.move_on_after(timeout) as waited:
            for worker in self.workers.values():
                await worker.settled.wait()
        failed = [w for w in self.workers.values() if w.failure is not None]
        if failed:
            raise StageStartupError("\n".join(w.failure for w in failed if w.failure))
        if waited.cancelled_caught:
            late = [w.name for w in self.workers.values() if not w.settled.is_set()]
            raise StageStartupError(f"process(es) {late} not ready within the start-up timeout of {timeout:g} s")

    def _write_spec(self, process: str, shm_prefix: str) -> Path:
        spec = WorkerSpec(
            config=self._config,
            process=process,
            ipc_dir=str(self._ipc_dir),
            shm_prefix=shm_prefix,
            trace_path=None if self._trace_path is None else str(process_trace_path(self._trace_path, process)),
            sys_path=[p for p in sys.path if p],
        )
        path = self._ipc_dir / f"{process}.spec"
        with open(path, "wb") as handle:
            pickle.dump(spec, handle)
        return path

    def _settle_if_ready(self, worker: Worker) -> None:
        if worker.ready.is_set() and worker.subscribed.is_set():
            worker.settled.set()

    async def _on_ready(self, message: m.Ready) -> None:
        worker = self.workers.get(message.process)
        if worker is not None:
            worker.ready.set()
            self._settle_if_ready(worker)

    async def _watch_subscriptions(self, xpub: TrioSocket) -> None:
        prefix = b"\x01ready:"
        with trio.CancelScope(shield=True):  # ends when the endpoint closes the socket
            await self._read_subscriptions(xpub, prefix)

    async def _read_subscriptions(self, xpub: TrioSocket, prefix: bytes) -> None:
        while True:
            try:
                frames = await xpub.recv_multipart()
            except trio.ClosedResourceError:
                return
            if frames and frames[0].startswith(prefix):
                worker = self.workers.get(frames[0][len(prefix) :].decode(errors="replace"))
                if worker is not None:
                    worker.subscribed.set()
                    self._settle_if_ready(worker)

    async def _watch_exit(self, worker: Worker) -> None:
        assert worker.process is not None
        # Shielded: a stopping pipeline must still see its workers exit.
        with trio.CancelScope(shield=True):
            returncode = await worker.process.wait()
        worker.exited.set()
        if self._stopping:
            return
        if not worker.settled.is_set():
            exit_ = describe_exit(returncode)
            worker.failure = f"process {worker.name!r} (pid {worker.pid}) {exit_} before it was ready"
            path = startup_traceback_path(self._ipc_dir, worker.name)
            if path.exists():
                worker.failure += f":\n{path.read_text()}"
            worker.settled.set()
            return
        log.error("stage_process_died", process=worker.name, pid=worker.pid, exit=describe_exit(returncode))
        self._on_death(worker)

    async def stop(self) -> None:
        """Stop every worker: Shutdown, then terminate, then kill; all in parallel."""
        self._stopping = True
        async with trio.open_nursery() as nursery:
            for worker in self.workers.values():
                nursery.start_soon(self._stop_one, worker)

    async def _stop_one(self, worker: Worker) -> None:
        proc = worker.process
        if proc is None:
            return
        if not worker.exited.is_set():
            with trio.move_on_after(1):
                await self._endpoint.send(worker.name, m.Shutdown())
            with trio.move_on_after(GRACEFUL_STOP_S):
                await worker.exited.wait()
        if not worker.exited.is_set():
            log.warning("terminating_stage_process", process=worker.name, pid=proc.pid)
            proc.terminate()
            with trio.move_on_after(FIRM_STOP_S):
                await worker.exited.wait()
        if not worker.exited.is_set():
            proc.kill()
            await proc.wait()
        if proc.stdin is not None:
            await proc.stdin.aclose()
