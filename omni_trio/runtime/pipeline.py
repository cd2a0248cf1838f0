"""``open_pipeline``: build the stages, place them, run them, tear them down.

Stages with ``process=None`` run inside the caller's process on the
caller's trio loop ("embedded" placement): no child process, no socket.
Stages that name a process run in worker processes (see
:mod:`omni_trio.runtime.workers.supervisor` and :mod:`omni_trio.runtime.workers.worker`); the caller's
process then talks to them through its :class:`~omni_trio.control.endpoint.Endpoint`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from omni_trio.comm.ownership import new_run_prefix, reclaim_dead_runs, write_owner_record
from omni_trio.comm.segments import remove_segments
from omni_trio.config import MAIN_PROCESS, PipelineConfig, check_imports
from omni_trio.config.processes import host_of
from omni_trio.config.replicas import worker_processes
from omni_trio.control.bindings import BindingTable
from omni_trio.control.wire.auth import new_secret
from omni_trio.control.wire.curve import new_curve_keys
from omni_trio.coordinator.coordinator import Coordinator
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.coordinator.replicas import ReplicaDispatcher
from omni_trio.errors import StageProcessDied, Terminated
from omni_trio.runtime.assembly import build_stages, connect_stages, endpoint_for
from omni_trio.runtime.deaths import WorkerDeaths
from omni_trio.runtime.embedded import run_embedded
from omni_trio.runtime.sigterm import cancel_on_sigterm
from omni_trio.runtime.stage_reports import route_stage_reports
from omni_trio.runtime.worker_placement import WorkerPlacement
from omni_trio.runtime.workers.supervisor import Supervisor, Worker
from omni_trio.stage.links import LocalCoordinatorLink
from omni_trio.stage.stage import Stage
from omni_trio.tracing.trace import Tracer, get_logger, trace_path_from_env

log = get_logger(__name__)

#: How long worker processes may take to build and warm up their stages.
DEFAULT_START_TIMEOUT_S = 120.0


@asynccontextmanager
async def _single_errors() -> AsyncIterator[None]:
    """Re-raise the pipeline nursery's group of one error as that error.

    Callers of ``open_pipeline`` see their own exception (or the one start-up
    error) as it was raised, not wrapped in an ExceptionGroup by the
    pipeline's nursery. Only that one level is unwrapped: a caller's own
    ExceptionGroup comes out unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@asynccontextmanager
async def open_pipeline(
    config: PipelineConfig,
    *,
    trace: str | os.PathLike[str] | None = None,
    start_timeout: float = DEFAULT_START_TIMEOUT_S,
) -> AsyncIterator[Pipeline]:
    """Start ``config``'s stages and yield the pipeline's :class:`~omni_trio.Pipeline`; stop everything on exit.

    Stages with ``process=None`` run in the caller's trio loop; stages that
    name a process run in one worker process per name, started in parallel
    (``start_timeout`` bounds their start-up). ``trace`` (or
    ``$OMNI_TRIO_TRACE``) names a JSON-lines trace file; worker processes
    write siblings of it (see :func:`omni_trio.read_trace`).

    On exit, requests still running are aborted everywhere, stages drain
    what their schedulers already published, workers stop (terminated, then
    killed, if they do not), and the IPC directory and shared-memory
    segments of the run are removed. A worker that dies fails every live
    request with :class:`StageProcessDied` and ends the pipeline with it,
    unless its process says ``restart="on-failure"`` (:class:`~omni_trio.ProcessConfig`): then it is started
    again (at most ``max_restarts`` times; new submits wait until it is
    ready) and the pipeline keeps serving.

    SIGTERM (when the program has no handler of its own) shuts the pipeline
    down the same way and then raises :class:`~omni_trio.Terminated` (a
    ``SystemExit`` with status 143). Before starting workers, it removes what
    runs whose owner process is provably dead left behind (see
    :mod:`omni_trio.comm.ownership`).
    """
    check_imports(config)
    trace_path = trace_path_from_env(trace)
    tracer = Tracer(trace_path, MAIN_PROCESS)
    groups = worker_processes(config)
    try:
        async with _single_errors():
            with trio.CancelScope() as scope, cancel_on_sigterm(scope) as sigterm:
                if groups:
                    placed = _in_processes(config, groups, tracer, trace_path, start_timeout)
                else:
                    placed = run_embedded(config, tracer)
                try:
                    async with placed as coordinator:
                        yield Pipeline(coordinator)
                except StageProcessDied:
                    # SIGTERM sent to the whole process group (a service manager's
                    # control-group stop) kills the workers too: that is the termination.
                    if not sigterm.received:
                        raise
            if sigterm.received:
                raise Terminated()
    finally:
        tracer.close()


def _make_ipc_dir(config: PipelineConfig, run_prefix: str) -> Path:
    base = Path(config.endpoints.base_path or tempfile.gettempdir())
    reclaimed = reclaim_dead_runs([base])
    if reclaimed.directories or reclaimed.segments:
        log.warning("reclaimed_dead_runs", directories=reclaimed.directories, segments=len(reclaimed.segments))
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", config.name or "pipeline")[:24]
    # mkdtemp creates the directory owner-only (0700): only we may reach its sockets.
    ipc_dir = Path(tempfile.mkdtemp(prefix=f"omnitrio-{name}-", dir=base))
    try:
        write_owner_record(ipc_dir, run_prefix)
    except BaseException:
        shutil.rmtree(ipc_dir, ignore_errors=True)
        raise
    return ipc_dir


@asynccontextmanager
async def _in_processes(
    config: PipelineConfig, groups: list[str], tracer: Tracer, trace_path: Path | None, start_timeout: float
) -> AsyncIterator[Coordinator]:
    run_prefix = new_run_prefix()
    ipc_dir = _make_ipc_dir(config, run_prefix)
    secret = new_secret()
    main_host = host_of(config.processes, MAIN_PROCESS)
    # Only a run with processes on other hosts has TCP sockets, and so CURVE keys.
    curve = None if main_host is None else new_curve_keys()
    died: list[StageProcessDied] = []
    try:
        async with trio.open_nursery() as nursery:
            endpoint = endpoint_for(config, MAIN_PROCESS, ipc_dir, f"{run_prefix}-0", tracer, secret, curve=curve)
            await nursery.start(endpoint.serve)
            if main_host is not None:
                endpoint.listen_tcp(f"tcp://{main_host}:*")
            local: dict[str, Stage] = {}
            bindings = BindingTable(config)
            replicas = ReplicaDispatcher(config, bindings)

            def fatal(error: StageProcessDied) -> None:
                died.append(error)
                nursery.cancel_scope.cancel()

            async def on_death(worker: Worker) -> None:
                await deaths.on_death(worker)

            async def on_lost(worker: Worker) -> list[str]:
                return await deaths.on_lost(worker)

            supervisor = Supervisor(
                config,
                groups=groups,
                ipc_dir=ipc_dir,
                run_prefix=run_prefix,
                trace_path=trace_path,
                endpoint=endpoint,
                on_death=on_death,
                on_lost=on_lost,
                on_restarted=lambda worker: replicas.mark(worker.name, None),
                start_timeout=start_timeout,
            )
            placement = WorkerPlacement(local, endpoint, supervisor, bindings)
            coordinator = Coordinator(config, placement, tracer, nursery, replicas)
            deaths = WorkerDeaths(coordinator, placement, replicas, fatal)
            route_stage_reports(coordinator, endpoint)
            try:
                await supervisor.spawn(nursery)
                placed_here = [stage for stage in config.stages if stage.process is None]
                link = LocalCoordinatorLink(coordinator, endpoint.transports)
                local.update(build_stages(config, placed_here, process=MAIN_PROCESS, tracer=tracer, coordinator=link))
                connect_stages(config, local, endpoint, tracer, bindings)
                endpoint.host(local)
                for stage in local.values():
                    await nursery.start(stage.run)
                await supervisor.wait_ready(start_timeout)
                await supervisor.announce_peers()
                yield coordinator
            finally:
                with trio.CancelScope(shield=True):
                    endpoint.begin_closing()
                    await coordinator.close()
                    for stage in local.values():
                        stage.stop()
                    await supervisor.stop()
                    endpoint.stop()
                    nursery.cancel_scope.cancel()
        if died:
            raise died[0]
    finally:
        shutil.rmtree(ipc_dir, ignore_errors=True)
        remove_segments(run_prefix)
