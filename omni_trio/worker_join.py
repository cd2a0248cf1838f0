"""``omni-trio worker --join tcp://HOST:PORT --key KEYFILE``: the worker side of the ``manual`` launcher.

The key file (written by the caller, see :mod:`omni_trio.join`) holds the run's CURVE keys and secret,
the group's name and the host to bind on. The worker binds its control socket there (any free port),
sends ``Join`` to the caller over CURVE, waits (up to :data:`JOIN_TIMEOUT_S`) for its spec on that
socket, then serves like a local worker. It exits when the caller says Shutdown, or when its connection
to the caller drops (the caller is gone, or its host stopped answering heartbeats).
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import attrs
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from omni_trio.config import EndpointsConfig
from omni_trio.control import messages as m
from omni_trio.control.auth import FrameMac
from omni_trio.control.codec import decode, encode
from omni_trio.control.curve import Curve
from omni_trio.control.zmq_trio import SocketPolicy, TrioSocket, bind_pull, connect_watched_push
from omni_trio.join import KeyFile
from omni_trio.supervisor import WorkerSpec

__all__ = ["JOIN_TIMEOUT_S", "join"]

#: How long a joining worker waits for the caller's answer.
JOIN_TIMEOUT_S = 60.0


async def _spec_from(pull: TrioSocket) -> bytes:
    while True:
        message = decode(await pull.recv_multipart())
        if isinstance(message, m.JoinSpec):
            return message.spec


async def _exit_when_caller_is_gone(monitor: TrioSocket) -> None:
    connected = False
    while True:
        event = parse_monitor_message(await monitor.recv_multipart())
        if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            connected = True
        elif event["event"] == zmq.EVENT_DISCONNECTED and connected:
            print(f"omni-trio worker {os.getpid()}: the connection to the caller dropped; exiting", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)


async def join(join_address: str, key: KeyFile) -> None:
    """Join the run ``key`` belongs to at ``join_address`` and serve until it ends."""
    from omni_trio.worker import serve

    ctx: zmq.Context[Any] = zmq.Context()
    policy = SocketPolicy(
        FrameMac(bytes.fromhex(key.secret), process=key.process),
        EndpointsConfig().max_message_bytes,
        Curve(key.curve, process=key.process),
    )
    pull = bind_pull(ctx, f"tcp://{key.host}:*", policy)
    to_caller, monitor = connect_watched_push(
        ctx, key.join, policy, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
    )
    local_dir: str | None = None
    try:
        with trio.fail_after(JOIN_TIMEOUT_S):
            await to_caller.send_multipart(encode(m.Join(process=key.process, endpoint=pull.source, pid=os.getpid())))
            raw = await _spec_from(pull)
        spec: WorkerSpec = pickle.loads(raw)  # sealed with the run's secret, over CURVE: from the caller
        sys.path[:0] = [p for p in spec.sys_path if p not in sys.path and os.path.isdir(p)]
        # Nothing of the caller's filesystem is ours: a private directory of our own, a trace only
        # where the caller's trace directory exists here too (one machine, network namespaces).
        local_dir = tempfile.mkdtemp(prefix=f"omnitrio-{key.process}-")
        trace = spec.trace_path if spec.trace_path and Path(spec.trace_path).parent.is_dir() else None
        spec = attrs.evolve(spec, ipc_dir=local_dir, trace_path=trace)
        run_policy = attrs.evolve(policy, max_message_bytes=spec.config.endpoints.max_message_bytes)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_exit_when_caller_is_gone, monitor)
            await serve(spec, context=ctx, pull=pull, policy=run_policy)
            nursery.cancel_scope.cancel()
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        to_caller.close()
        monitor.close()
        if policy.curve is not None:
            policy.curve.close(ctx)
        ctx.destroy(linger=0)
        if local_dir is not None:
            shutil.rmtree(local_dir, ignore_errors=True)
