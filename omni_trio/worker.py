"""``python -m omni_trio.worker SPEC``: one process group's ``trio.run``.

The runtime starts one worker per process group. A worker builds its
stages, binds its control socket, subscribes to the abort broadcast, starts
the stages (scheduler warm-up included) and reports ``Ready``; any failure
before that leaves its traceback in ``<process>.traceback`` in the IPC
directory (a file: it is there before the process exits, which a message
might not be) and exits 1. It serves
until ``Shutdown``, then stops its stages (they drain what their schedulers
already published) and exits 0. It exits when the runtime's process is gone
(EOF on its stdin pipe) and ignores Ctrl-C, which the runtime handles for the
whole pipeline.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import attrs
import trio
import zmq

from omni_trio.control import messages as m
from omni_trio.control.endpoint import ABORT_TOPIC, Endpoint, abort_path, ready_topic
from omni_trio.control.links import RemoteCoordinatorLink
from omni_trio.control.zmq_trio import SocketPolicy, TrioSocket, connect_sub
from omni_trio.join import KeyFile
from omni_trio.stage.replicas import BindingTable, split_replica
from omni_trio.stage.stage import Stage
from omni_trio.supervisor import WorkerSpec, startup_traceback_path
from omni_trio.tracing import Tracer


async def _exit_with_parent() -> None:
    """End the worker when the runtime's process is gone.

    The runtime holds the write end of our stdin pipe and never writes: EOF
    means it exited, however it died. (``PR_SET_PDEATHSIG`` would not do:
    it fires when the spawning *thread* exits, and trio spawns from a
    worker thread.)
    """
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)
    while True:
        await trio.lowlevel.wait_readable(fd)
        try:
            if not os.read(fd, 4096):
                break
        except BlockingIOError:
            continue
    print(f"omni-trio worker {os.getpid()}: the pipeline's process is gone; exiting", file=sys.stderr)
    _exit(1)


async def serve(
    spec: WorkerSpec,
    *,
    context: zmq.Context[Any] | None = None,
    pull: TrioSocket | None = None,
    policy: SocketPolicy | None = None,
) -> None:
    """Run the worker's stages until the runtime says Shutdown.

    A worker that joined over TCP (:mod:`omni_trio.worker_join`) passes its ZMQ ``context`` and its
    bound receive socket ``pull`` and the ``policy`` of its sockets.
    """
    from omni_trio.runtime import endpoint_for

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
            if not spec.joined:  # a joined worker has no parent here: its connection's drop tells
                nursery.start_soon(_exit_with_parent)
            await nursery.start(endpoint.serve)
            try:
                try:
                    stages = await _start_stages(spec, endpoint, tracer, nursery, shutdown)
                except BaseException:
                    startup_traceback_path(Path(spec.ipc_dir), spec.process).write_text(traceback.format_exc())
                    raise
                await endpoint.send("main", m.Ready(process=spec.process, stages=list(stages)))
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
    from omni_trio.runtime import build_stages, connect_stages

    abort = connect_sub(endpoint.context, spec.abort_endpoint or abort_path(Path(spec.ipc_dir)), endpoint.policy)
    # Subscribing to our ready topic after the abort topic lets the runtime see,
    # through its XPUB socket, that the abort subscription is in place.
    abort.socket.setsockopt(zmq.SUBSCRIBE, ABORT_TOPIC)
    abort.socket.setsockopt(zmq.SUBSCRIBE, ready_topic(spec.process, endpoint.policy))
    endpoint.adopt(abort)
    endpoint.connect_abort_channel(abort)
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
        shutdown.set()

    async def on_stats(request: m.StatsRequest) -> None:
        # Every task here is ours: let work that is already runnable (a send whose
        # message is out, about to release its request) settle before counting.
        # (Imported here: trio.testing imports pytest, too slow for every start-up.)
        from trio.testing import wait_all_tasks_blocked

        await wait_all_tasks_blocked()
        reply = m.StatsReply(
            token=request.token,
            process=spec.process,
            stages={stage.address: attrs.asdict(stage.stats()) for stage in stages.values()},
            refused_frames=endpoint.policy.auth.refused,
        )
        await endpoint.send(request.reply_to, reply)

    endpoint.on(m.Shutdown, on_shutdown)
    endpoint.on(m.StatsRequest, on_stats)
    for stage in stages.values():
        await nursery.start(stage.run)
    return stages


async def _stop_stage(stage: Stage) -> None:
    stage.stop()
    await stage.stopped.wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``python -m omni_trio.worker SPEC``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m omni_trio.worker SPEC (started by omni_trio.open_pipeline)")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(args[0], "rb") as handle:
        spec: WorkerSpec = pickle.load(handle)
    sys.path[:0] = [p for p in spec.sys_path if p not in sys.path]
    try:
        trio.run(serve, spec)
    except BaseException:  # noqa: BLE001 - the traceback was reported; the exit code tells the parent
        traceback.print_exc()
        _exit(1)
    _exit(0)


def run_joined(join_address: str, key: KeyFile) -> None:
    """Entry point of ``omni-trio worker --join``: join the run, serve, exit (0 after Shutdown)."""
    from omni_trio.worker_join import join

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        trio.run(join, join_address, key)
    except BaseException:  # noqa: BLE001 - the traceback was printed; the exit code tells
        _exit(1)
    _exit(0)


def _exit(code: int) -> None:
    # A hard exit: a user thread that never ends must not keep the worker alive.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
