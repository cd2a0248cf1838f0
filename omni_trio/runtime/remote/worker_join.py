"""``omni-trio worker --join tcp://HOST:PORT --key KEYFILE``: the worker side of the ``manual`` launcher.

The key file (written by the caller, see :mod:`omni_trio.runtime.remote.join`) holds the run's CURVE keys and secret,
the group's name and the host to bind on. The worker binds its control socket there (any free port),
sends ``Join`` to the caller over CURVE, waits (up to :data:`JOIN_TIMEOUT_S`) for its spec on that
socket, then serves like a local worker. It exits when the caller says Shutdown, or when a connection
to the caller drops: the one it joined over (the caller is gone, or its host stopped answering
heartbeats) or the one to its incarnation's own listener (the caller gave this incarnation up: it
noticed the drop first, or stopped waiting for it). Then it removes what it created (its
shared-memory segments, its private directory) and exits at once: a restarted worker (an
orchestrator runs the same command again) joins as a new incarnation.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio
import zmq

from omni_trio.comm.ownership import Owner, write_owner_record
from omni_trio.comm.segments import freeze_creation, remove_segments
from omni_trio.config import MAIN_PROCESS, EndpointsConfig
from omni_trio.control.sockets.limits import inbox_limits
from omni_trio.control.sockets.zmq_sockets import bind_pull, connect_watched, wait_dropped
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import FrameMac
from omni_trio.control.wire.codec import decode, encode
from omni_trio.control.wire.curve import Curve
from omni_trio.runtime.remote.join import KeyFile
from omni_trio.runtime.workers.spec import WorkerSpec
from omni_trio.runtime.workers.worker import hard_exit, serve

__all__ = ["JOIN_TIMEOUT_S", "join", "run_joined"]

#: How long a joining worker waits for the caller's answer.
JOIN_TIMEOUT_S = 60.0


async def _spec_from(pull: TrioSocket) -> bytes:
    while True:
        message = decode(await pull.recv_multipart())
        if isinstance(message, m.JoinSpec):
            return message.spec


async def _exit_when_dropped(monitor: TrioSocket, release: Callable[[], None]) -> None:
    """Once the watched connection to the caller dropped: ``release()`` what this worker holds and exit."""
    await wait_dropped(monitor)
    # Out at once: a stage's thread may be stuck in user code, and nobody waits for its results.
    release()
    print(f"omni-trio worker {os.getpid()}: the connection to the caller dropped; exiting", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def _release(shm_prefix: str, local_dir: str) -> None:
    """What a worker that exits without stopping its stages leaves: its segments, its directory.
    Only its own segments (its prefix): the caller may share this /dev/shm (namespaces of one host)."""
    freeze_creation()
    remove_segments(shm_prefix)
    shutil.rmtree(local_dir, ignore_errors=True)


async def join(join_address: str, key: KeyFile) -> None:
    """Join the run ``key`` belongs to at ``join_address`` and serve until it ends."""
    ctx: zmq.Context[Any] = zmq.Context()
    policy = SocketPolicy(
        FrameMac(bytes.fromhex(key.secret), process=key.process),
        EndpointsConfig().max_message_bytes,
        Curve(key.curve, process=key.process),
    )
    pull = bind_pull(ctx, f"tcp://{key.host}:*", policy)
    to_caller, monitor = connect_watched(ctx, key.join, policy)
    sockets = [to_caller, monitor]
    local_dir: str | None = None
    try:
        with trio.fail_after(JOIN_TIMEOUT_S):
            await to_caller.send_multipart(encode(m.Join(process=key.process, address=pull.source, pid=os.getpid())))
            raw = await _spec_from(pull)
        spec: WorkerSpec = pickle.loads(raw)  # sealed with the run's secret, over CURVE: from the caller
        sys.path[:0] = [p for p in spec.sys_path if p not in sys.path and os.path.isdir(p)]
        # Nothing of the caller's filesystem is ours: a private directory of our own, a trace only
        # where the caller's trace directory exists here too (one machine, network namespaces).
        local_dir = tempfile.mkdtemp(prefix=f"omnitrio-{key.process}-")
        # Ours to remove when we exit; if we are killed, `omni-trio reclaim` here removes it.
        write_owner_record(Path(local_dir), spec.shm_prefix, Owner.current())
        trace = spec.trace_path if spec.trace_path and Path(spec.trace_path).parent.is_dir() else None
        spec = attrs.evolve(spec, ipc_dir=local_dir, trace_path=trace)
        run_policy = attrs.evolve(
            policy,
            max_message_bytes=spec.config.endpoints.max_message_bytes,
            limits=inbox_limits(spec.config.endpoints),
        )
        # The caller's listener for this incarnation: closed when the caller gives it up.
        to_incarnation, incarnation_monitor = connect_watched(ctx, spec.tcp[MAIN_PROCESS], policy)
        sockets += [to_incarnation, incarnation_monitor]
        release = functools.partial(_release, spec.shm_prefix, local_dir)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_exit_when_dropped, monitor, release)
            nursery.start_soon(_exit_when_dropped, incarnation_monitor, release)
            await serve(spec, context=ctx, pull=pull, policy=run_policy)
            nursery.cancel_scope.cancel()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        for sock in sockets:
            sock.close()
        if policy.curve is not None:
            policy.curve.close(ctx)
        ctx.destroy(linger=0)
        if local_dir is not None:
            shutil.rmtree(local_dir, ignore_errors=True)


def run_joined(join_address: str, key: KeyFile) -> None:
    """Entry point of ``omni-trio worker --join``: join the run, serve, exit (0 after Shutdown)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        trio.run(join, join_address, key)
    except BaseException:  # noqa: BLE001 - the traceback was printed; the exit code tells
        hard_exit(1)
    hard_exit(0)
