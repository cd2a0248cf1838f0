"""Worker processes as trio tasks: start in parallel, wait for readiness, notice death, stop.

Each process group runs what ``python -m omni_trio.runtime.workers.worker SPEC`` runs, started
by the pipeline's launcher (:mod:`omni_trio.runtime.workers.launch`: forked from a preloaded
template by default, or spawned). Its exit is an awaited event, not a poll.
Start-up is ready when the worker said ``Ready`` (its control socket, where
aborts arrive too, is bound by then, so no abort can be missed). Shutdown
is graceful (``Shutdown``, stages drain), then firm (terminate, then kill),
all processes in parallel, never blocking the trio loop.

A process whose :class:`~omni_trio.ProcessConfig` says ``restart="on-failure"`` is started again after
it died (same name, same socket path; peers' PUSH sockets reconnect on their
own), after an exponential backoff, at most ``max_restarts`` times over the
pipeline's life (the first wait is its ``restart_backoff_s``). Each
attempt goes through the same readiness handshake. A ``manual`` or ``ray``
group's worker is started again its launcher's way (:mod:`omni_trio.runtime.remote.launchers`)
and joins as a new incarnation.

In a run where some worker joined over TCP, the caller sends each worker its peers'
``tcp://`` addresses (:meth:`Supervisor.announce_peers`) once all are ready, and
again whenever a restarted worker is ready at a new address; a restarted local
worker that listens on TCP binds its predecessor's port again.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import attrs
import trio

from omni_trio.comm.segments import remove_segments
from omni_trio.config import PipelineConfig, process_edges
from omni_trio.config.processes import host_of, joins, tcp_listeners
from omni_trio.config.replicas import replica_groups, split_replica
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.wire import messages as m
from omni_trio.errors import StageStartupError, describe_exit
from omni_trio.runtime.remote.join import RemoteProcess
from omni_trio.runtime.remote.launchers import RemoteWorkers
from omni_trio.runtime.workers.launch import Launcher, WorkerProcess, launcher_for
from omni_trio.runtime.workers.spec import WorkerSpec, startup_traceback_path
from omni_trio.tracing.trace import get_logger, process_trace_path

log = get_logger(__name__)

#: How long stopping workers may drain before they are terminated, then killed.
GRACEFUL_STOP_S = 10.0
FIRM_STOP_S = 5.0


@attrs.define(eq=False)
class Worker:
    """One worker process and what we know about it."""

    name: str
    process: WorkerProcess | RemoteProcess | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    failure: str | None = None
    #: 0 for the first start, n for the n-th restart.
    attempt: int = 0
    shm_prefix: str = ""
    #: Requests failed when an earlier incarnation died (see :attr:`WorkerSpec.retired`).
    retired: list[str] = attrs.field(factory=list)

    @property
    def live(self) -> bool:
        """Ready and not exited: it answers aborts and stats."""
        return self.settled.is_set() and self.failure is None and not self.exited.is_set()

    @property
    def pid(self) -> int | None:
        """The process id (None before it started)."""
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status (None while running)."""
        return None if self.process is None else self.process.returncode


class Supervisor:
    """Starts, watches and stops the worker processes of one pipeline.

    ``on_death(worker)`` is awaited when a worker that was ready dies and is not
    (or no longer) restarted: the pipeline must end (unless the worker was a
    replica whose group lives on). ``on_lost(worker)`` is awaited instead when
    it will be restarted (the process counts as restarting meanwhile); it fails
    what the worker may have held and returns those request ids, which the new
    process then drops. ``on_restarted(worker)``
    is called when a restarted worker is ready.
    """

    def __init__(
        self,
        config: PipelineConfig,
        *,
        groups: list[str],
        ipc_dir: Path,
        run_prefix: str,
        trace_path: Path | None,
        endpoint: Endpoint,
        on_death: Callable[[Worker], Awaitable[None]],
        on_lost: Callable[[Worker], Awaitable[list[str]]] | None = None,
        on_restarted: Callable[[Worker], None] | None = None,
        start_timeout: float = 120.0,
        launcher: Launcher | None = None,
    ) -> None:
        self._config = config
        self._ipc_dir = ipc_dir
        self._run_prefix = run_prefix
        self._trace_path = trace_path
        self._endpoint = endpoint
        self._on_death = on_death
        self._on_lost = on_lost
        self._on_restarted = on_restarted
        self.workers = {name: Worker(name) for name in groups}
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        #: Bounds each restarted process's start-up, like the pipeline's.
        self._start_timeout = start_timeout
        #: ``launcher_for(config)`` unless the caller chose one.
        self._launcher = launcher or launcher_for(config, ipc_dir, start_timeout=start_timeout)
        #: Segment prefixes are ``<run>-<index>``; a restarted worker gets a fresh index, so
        #: its segments never collide with those its dead predecessor left behind.
        self._next_index = len(groups) + 1
        self._policy = {name: self._restart_policy(name) for name in groups}
        self._backoff = {name: config.process(name).restart_backoff_s for name in groups}
        self._restarts = dict.fromkeys(groups, 0)
        #: Processes being restarted, each with the event set when that is over (either way).
        self._restarting: dict[str, trio.Event] = {}
        #: One per restart in progress: :meth:`stop` cancels their backoffs and readiness waits.
        self._restart_scopes: set[trio.CancelScope] = set()
        #: Held while a process is being spawned: :meth:`stop` must see every process that exists.
        self._spawn_lock = trio.Lock()
        #: Local groups that also receive over TCP, and where each process receives over TCP (from its Ready).
        self._listeners = tcp_listeners(config.processes, process_edges(config))
        self._tcp_addresses: dict[str, str] = {}
        endpoint.on(m.Ready, self._on_ready)
        self._remote = RemoteWorkers(endpoint, self._remote_spec, ipc_dir, replica_groups(config))

    def _restart_policy(self, process: str) -> int:
        """How many restarts ``process`` may have (0: none)."""
        settings = self._config.process(process)
        return settings.max_restarts if settings.restart == "on-failure" else 0

    def live_workers(self) -> list[Worker]:
        """Workers that are ready and have not exited (a restarting one counts once it is ready again)."""
        return [w for w in self.workers.values() if w.live]

    def restarting(self) -> list[str]:
        """Processes being restarted now."""
        return sorted(self._restarting)

    def superseded_messages(self) -> dict[str, int]:
        """Per ``manual`` or ``ray`` process, the messages of its given-up incarnations that were dropped."""
        return self._remote.superseded_messages()

    async def wait_restarts(self, processes: Collection[str] | None = None) -> None:
        """Return once no process (of ``processes``, if given) is being restarted (each restart ended, either way)."""
        while waiting := [done for name, done in self._restarting.items() if processes is None or name in processes]:
            await waiting[0].wait()

    async def spawn(self, nursery: trio.Nursery) -> None:
        """Start every worker; they initialise in parallel (see :meth:`wait_ready`)."""
        self._nursery = nursery
        await self._launcher.start(nursery)
        for index, worker in enumerate(self.workers.values(), start=1):
            await self._start(worker, index, [])

    async def _start(self, worker: Worker, index: int, retired: list[str]) -> None:
        assert self._nursery is not None
        worker.shm_prefix = f"{self._run_prefix}-{index}"
        worker.retired = retired
        placement = self._config.processes.get(split_replica(worker.name)[0])
        if placement is not None and placement.launcher != "local":
            worker.process = await self._remote.start(worker.name, placement, self._nursery)
            self._nursery.start_soon(self._watch_exit, worker)
            return
        spec_path = self._write_spec(worker.name, worker.shm_prefix, retired)
        worker.process = await self._launcher.launch(worker.name, spec_path)
        self._nursery.start_soon(self._watch_exit, worker)

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

    def _peer_addresses(self, process: str) -> dict[str, str]:
        """The ``tcp://`` addresses of the workers ``process`` reaches over TCP (it or they joined over TCP)."""
        processes = self._config.processes
        return {
            peer: address for peer, address in self._tcp_addresses.items()
            if peer != process and (joins(processes, process) or joins(processes, peer))
        }

    async def announce_peers(self) -> None:
        """Send every ready worker the ``tcp://`` addresses of the peers it reaches over TCP: the ports
        of the local listeners and of the workers that joined are known only once all are ready. Nothing
        in a run where no worker joined over TCP."""
        if not any(joins(self._config.processes, name) for name in self.workers):
            return
        for worker in self.live_workers():
            await self._endpoint.send(worker.name, m.PeerAddresses(addresses=self._peer_addresses(worker.name)))

    def _remote_spec(self, process: str, main: str) -> WorkerSpec:
        """The spec of a ``manual`` or ``ray`` worker that joined: it reaches the caller at ``main``
        (its incarnation's own listener) over TCP."""
        worker = self.workers[process]
        tcp = self._endpoint.tcp_addresses
        assert self._endpoint.policy.curve is not None
        tcp["main"] = main
        spec = self._spec(process, worker.shm_prefix, worker.retired)
        return attrs.evolve(
            spec, curve=self._endpoint.policy.curve.keys, tcp=tcp, joined=True
        )

    def _write_spec(self, process: str, shm_prefix: str, retired: list[str]) -> Path:
        spec = self._spec(process, shm_prefix, retired)
        path = self._ipc_dir / f"{process}.spec"
        # Owner-only from the start: it holds the run's secret.
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "wb") as handle:
            pickle.dump(spec, handle)
        return path

    def _spec(self, process: str, shm_prefix: str, retired: list[str]) -> WorkerSpec:
        listens = split_replica(process)[0] in self._listeners
        curve = self._endpoint.policy.curve
        # A restarted listener binds its predecessor's port, and knows its peers already.
        listen = self._tcp_addresses.get(process) or f"tcp://{host_of(self._config.processes, process)}:*"
        return WorkerSpec(
            config=self._config,
            process=process,
            ipc_dir=str(self._ipc_dir),
            shm_prefix=shm_prefix,
            secret=self._endpoint.policy.auth.secret,
            trace_path=None if self._trace_path is None else str(process_trace_path(self._trace_path, process)),
            sys_path=[p for p in sys.path if p],
            retired=retired,
            curve=curve.keys if listens and curve is not None else None,
            tcp=self._peer_addresses(process) if listens else {},
            listen=listen if listens else None,
        )

    async def _on_ready(self, message: m.Ready) -> None:
        worker = self.workers.get(message.process)
        if worker is not None:
            if message.address:
                self._tcp_addresses[message.process] = message.address
            worker.settled.set()

    async def _watch_exit(self, worker: Worker) -> None:
        assert worker.process is not None
        # Shielded: a stopping pipeline must still see its workers exit.
        with trio.CancelScope(shield=True):
            returncode = await worker.process.wait()
        worker.exited.set()
        if self._stopping:
            return
        if not worker.settled.is_set():
            if worker.failure is not None:  # given up on (not ready in time): that is what failed
                worker.settled.set()
                return
            exit_ = describe_exit(returncode)
            worker.failure = f"process {worker.name!r} (pid {worker.pid}) {exit_} before it was ready"
            path = startup_traceback_path(self._ipc_dir, worker.name)
            if path.exists():
                worker.failure += f":\n{path.read_text()}"
            worker.settled.set()
            return
        log.error("stage_process_died", process=worker.name, pid=worker.pid, exit=describe_exit(returncode))
        if worker.name in self._restarting:
            return  # died as soon as it was ready: the restart in progress counts it as a failed attempt
        if self._restarts[worker.name] >= self._policy[worker.name] or self._on_lost is None:
            await self._on_death(worker)
            return
        # Restarting from now on: a submit that needs the process waits, while on_lost learns
        # from the other processes what the dead one may have held.
        done = self._restarting[worker.name] = trio.Event()
        try:
            retired = await self._on_lost(worker)
            await self._restart(worker, retired)
        finally:
            if self._restarting.get(worker.name) is done:
                del self._restarting[worker.name]
            done.set()

    async def _restart(self, dead: Worker, retired: list[str]) -> None:
        """Start ``dead``'s process again, with backoff, until it is ready or no attempt is left."""
        scope = trio.CancelScope()
        self._restart_scopes.add(scope)
        try:
            await self._restart_attempts(dead, retired, scope)
        finally:
            self._restart_scopes.discard(scope)

    async def _restart_attempts(self, dead: Worker, retired: list[str], scope: trio.CancelScope) -> None:
        name = dead.name
        with scope:
            while self._restarts[name] < self._policy[name]:
                attempt = self._restarts[name] = self._restarts[name] + 1
                # A backoff between attempts, not a poll: a process that dies at once
                # must not be restarted in a tight loop.
                await trio.sleep(self._backoff[name] * 2 ** (attempt - 1))
                # What the dead incarnation left in /dev/shm: its readers were failed with it.
                remove_segments(dead.shm_prefix)
                worker = Worker(name, attempt=attempt)
                async with self._spawn_lock:
                    if self._stopping:
                        return
                    self.workers[name] = worker
                    index, self._next_index = self._next_index, self._next_index + 1
                    # Shielded: a process spawned but not recorded would be left running.
                    with trio.CancelScope(shield=True):
                        await self._start(worker, index, retired)
                with trio.move_on_after(self._start_timeout):
                    await worker.settled.wait()
                if worker.live:
                    log.warning("stage_process_restarted", process=name, attempt=attempt, pid=worker.pid)
                    # A joined worker listens at a new port: its peers learn it, it learns theirs.
                    await self.announce_peers()
                    if self._on_restarted is not None:
                        self._on_restarted(worker)
                    return
                if worker.failure is None and worker.process is not None and not worker.exited.is_set():
                    worker.failure = f"process {name!r} (pid {worker.pid}) not ready within {self._start_timeout:g} s"
                    if isinstance(worker.process, RemoteProcess) and not worker.process.joined.is_set():
                        worker.failure = f"no worker of process {name!r} joined within {self._start_timeout:g} s"
                    worker.process.kill()
                    await worker.exited.wait()
                log.error("stage_process_restart_failed", process=name, attempt=attempt, error=worker.failure)
                dead = worker
            if not self._stopping:
                await self._on_death(dead)

    async def stop(self) -> None:
        """Stop every worker: Shutdown, then terminate, then kill; all in parallel."""
        self._stopping = True
        for scope in self._restart_scopes:
            scope.cancel()
        # A restart spawning a process right now finishes first, so that it is stopped below.
        async with self._spawn_lock:
            pass
        async with trio.open_nursery() as nursery:
            for worker in self.workers.values():
                nursery.start_soon(self._stop_one, worker)
        await self._launcher.aclose()
        await self._remote.close()

    async def _stop_one(self, worker: Worker) -> None:
        proc = worker.process
        if proc is None:
            return
        # A restarted worker that is not ready holds no request: nothing to drain, and it
        # may not handle Shutdown yet.
        graceful = (worker.attempt == 0 or worker.live) and not (
            isinstance(proc, RemoteProcess) and not proc.joined.is_set()
        )
        if not worker.exited.is_set() and graceful:
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
