"""``python -m omni_trio.runtime.workers.worker SPEC``: one process group's ``trio.run``.

The runtime starts one worker per process group. A worker builds its
stages, binds its control socket (aborts arrive there too), starts
the stages (scheduler warm-up included) and reports ``Ready``; any failure
before that leaves its traceback in ``<process>.traceback`` in the IPC
directory (a file: it is there before the process exits, which a message
might not be) and exits 1. It serves
until ``Shutdown``, then stops its stages (they drain what their schedulers
already published) and exits 0. It ignores Ctrl-C, which the runtime handles
for the whole pipeline.

When the runtime's process is gone, however it died (SIGKILL included), the
worker removes what the run created and exits 1: see :func:`watch_owner`.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import stat
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import attrs
import trio
import zmq

from omni_trio.comm.ownership import owner_of_prefix, remove_run
from omni_trio.comm.segments import freeze_creation
from omni_trio.config import MAIN_PROCESS
from omni_trio.config.replicas import split_replica
from omni_trio.control.bindings import BindingTable
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.links import RemoteCoordinatorLink
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire import messages as m
from omni_trio.runtime.assembly import build_stages, connect_stages, endpoint_for
from omni_trio.runtime.heap import freeze_startup_heap
from omni_trio.runtime.workers.spec import WorkerSpec, startup_traceback_path
from omni_trio.stage.stage import Stage
from omni_trio.tracing.trace import Tracer, get_logger

log = get_logger(__name__)

#: The longest a stats request waits for this process's runnable work to settle before counting.
STATS_SETTLE_S = 0.05


def watch_owner(spec: WorkerSpec) -> None:
    """Block until the runtime's process is gone; then remove the run's files and exit 1.

    Runs in a thread of its own (started first thing in :func:`serve`), so
    that a trio loop stuck in user code or still importing does not delay it. Two signs, either is enough: EOF on
    our stdin pipe (the runtime holds its write end and never writes), and a
    pidfd of the run's owner becoming readable (the owner's pid and start
    time are in the run prefix; a pid reused by another process does not
    count). ``PR_SET_PDEATHSIG`` is not used: it fires when the spawning
    *thread* exits, and trio spawns from a worker thread that may end first.

    Then no segment is created here any more, and the run's segments (every
    process's, the caller's pools included: their names carry the run prefix,
    and only files of our uid are removed) and its IPC directory go.
    """
    run_prefix = spec.shm_prefix.rsplit("-", 1)[0]  # "<run prefix>-<process index>"
    poller = select.poll()
    stdin = sys.stdin.fileno()
    # Only a pipe's EOF means anything: a worker started another way may have /dev/null there.
    if stat.S_ISFIFO(os.fstat(stdin).st_mode):
        poller.register(stdin, select.POLLIN)
    gone = False
    owner = owner_of_prefix(run_prefix)
    if owner is not None:
        try:
            poller.register(os.pidfd_open(owner.pid), select.POLLIN)
        except ProcessLookupError:
            gone = True
        except OSError:
            pass  # no pidfd here (old kernel, seccomp): the stdin pipe still tells
        else:
            gone = not owner.alive()  # the pid could name another process by the time we opened it
    while not gone:
        for fd, _ in poller.poll():
            # The pidfd is readable once the owner exited; stdin at EOF (b"").
            if fd != stdin or not os.read(stdin, 4096):
                gone = True
    freeze_creation()
    removed = remove_run(Path(spec.ipc_dir), run_prefix)
    note = f"omni-trio worker {os.getpid()}: the pipeline's process is gone; removed its IPC directory"
    # Straight to the fd and out: the main thread may hold sys.stderr's lock, or be stuck.
    os.write(2, f"{note} and {len(removed)} shared-memory segment(s); exiting\n".encode())
    os._exit(1)


async def serve(
    spec: WorkerSpec,
    *,
    context: zmq.Context[Any] | None = None,
    pull: TrioSocket | None = None,
    policy: SocketPolicy | None = None,
) -> None:
    """Run the worker's stages until the runtime says Shutdown (or its owner is gone: :func:`watch_owner`).

    A worker that joined over TCP (:mod:`omni_trio.runtime.remote.worker_join`) passes its ZMQ ``context`` and its
    bound receive socket ``pull`` and the ``policy`` of its sockets.
    """
    if not spec.joined:
        # Here, not in main(): however the worker was started, it watches its owner before anything else.
        # A worker that joined over TCP has no owner on this host: its connection's drop tells instead.
        threading.Thread(target=watch_owner, args=(spec,), name="omni-trio-owner-watch", daemon=True).start()
    replica = split_replica(spec.process)[1]
    # Every event of a replica's process says which replica it is.
    tracer = Tracer(spec.trace_path, spec.process, {} if replica is None else {"replica": replica})
    endpoint = endpoint_for(
        spec.config, spec.process, Path(spec.ipc_dir), spec.shm_prefix, tracer, spec.secret,
        curve=spec.curve, tcp=spec.tcp, context=context, pull=pull, policy=policy,
    )
    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.serve)
            if spec.listen is not None:
                # An edge to or from a worker that joined over TCP: it reaches us here (CURVE), at
                # the port our Ready reports.
                listening = endpoint.listen_tcp(spec.listen)
                log.info("tcp_listening", process=spec.process, pid=os.getpid(), address=listening)
            try:
                try:
                    stages = await _start_stages(spec, endpoint, tracer, nursery, shutdown)
                except BaseException:
                    startup_traceback_path(Path(spec.ipc_dir), spec.process).write_text(traceback.format_exc())
                    raise
                # Start-up is over: full collections skip what it made from now on (runtime/heap.py).
                freeze_startup_heap()
                ready = m.Ready(process=spec.process, stages=list(stages), address=endpoint.tcp_address or "")
                await endpoint.send("main", ready)
                await shutdown.wait()
                async with trio.open_nursery() as stopping:
                    for stage in stages.values():
                        stopping.start_soon(_stop_stage, stage)
            finally:
                endpoint.stop()  # it is shielded: it ends only when told to
                nursery.cancel_scope.cancel()
    finally:
        tracer.close()


async def _start_stages(
    spec: WorkerSpec, endpoint: Endpoint, tracer: Tracer, nursery: trio.Nursery, shutdown: trio.Event
) -> dict[str, Stage]:
    config = spec.config
    group, replica = split_replica(spec.process)
    stages: dict[str, Stage] = build_stages(
        config,
        [s for s in config.stages if s.process == group],
        process=spec.process,
        tracer=tracer,
        coordinator=RemoteCoordinatorLink(endpoint, replica),
        replica=replica,
    )
    connect_stages(config, stages, endpoint, tracer, BindingTable(config))
    # Peers may still have messages for these requests queued towards our socket
    # path, sent to the incarnation that died: they must find them retired here.
    for stage in stages.values():
        for request_id in spec.retired:
            stage.aborted.add(request_id)
    endpoint.host({stage.address: stage for stage in stages.values()})

    async def on_shutdown(_: m.Shutdown) -> None:
        # Every worker of the run is told at once: a peer that has exited already is expected now.
        endpoint.begin_closing()
        shutdown.set()

    async def on_stats(request: m.StatsRequest) -> None:
        # Every task here is ours: let work that is already runnable (a send whose
        # message is out, about to release its request) settle before counting, but
        # only briefly: under steady traffic the tasks are never all blocked. The
        # counters are read in one go, without a checkpoint, so they are consistent.
        # (Imported here: trio.testing imports pytest, too slow for every start-up.)
        from trio.testing import wait_all_tasks_blocked

        with trio.move_on_after(STATS_SETTLE_S):
            await wait_all_tasks_blocked()
        reply = m.StatsReply(
            token=request.token,
            process=spec.process,
            stages={stage.address: attrs.asdict(stage.stats()) for stage in stages.values()},
            refused_frames=endpoint.refused,
            refused_connections=endpoint.refused_connections,
            undeliverable=endpoint.undeliverable,
        )
        await endpoint.send(request.reply_to, reply)

    async def on_held(request: m.HeldRequest) -> None:
        # Read in one go, like the counters: which requests this process holds when a peer died.
        held = sorted({request_id for stage in stages.values() for request_id in stage.active})
        await endpoint.send(MAIN_PROCESS, m.HeldReply(token=request.token, process=spec.process, request_ids=held))

    endpoint.on(m.Shutdown, on_shutdown)
    endpoint.on(m.StatsRequest, on_stats)
    endpoint.on(m.HeldRequest, on_held)
    for stage in stages.values():
        await nursery.start(stage.run)
    return stages


async def _stop_stage(stage: Stage) -> None:
    stage.stop()
    await stage.stopped.wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m omni_trio.runtime.workers.worker SPEC``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m omni_trio.runtime.workers.worker SPEC (started by omni_trio.open_pipeline)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(args[0], "rb") as handle:
        spec: WorkerSpec = pickle.load(handle)
    sys.path[:0] = [p for p in spec.sys_path if p not in sys.path]
    try:
        trio.run(serve, spec)
    except BaseException:  # noqa: BLE001 - the traceback was reported; the exit code tells the parent
        traceback.print_exc()
        hard_exit(1)
    hard_exit(0)


def hard_exit(code: int) -> None:
    """Flush stdout and stderr and end the process with ``code`` at once: a user thread that never
    ends must not keep the worker alive."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
