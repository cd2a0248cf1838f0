"""Join incarnations (omni_trio/runtime/remote/join.py): nothing a superseded incarnation sends reaches the
caller's state.

The caller's real endpoint and ManualWorkers over loopback TCP with CURVE; the test plays the joining
worker with sockets of the run's keys (what ``omni-trio worker --join`` does first).
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import zmq

from omni_trio.control.endpoint import Endpoint
from omni_trio.control.sockets.host import HostSockets
from omni_trio.control.sockets.zmq_sockets import bind_pull, connect_push
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import FrameMac, new_secret
from omni_trio.control.wire.codec import decode, encode
from omni_trio.control.wire.curve import Curve, new_curve_keys
from omni_trio.runtime.remote.join import ManualWorkers
from omni_trio.tracing.trace import Tracer


@pytest.fixture
async def caller() -> AsyncIterator[tuple[Endpoint, ManualWorkers, SocketPolicy]]:
    keys, secret = new_curve_keys(), new_secret()
    ipc_dir = Path(tempfile.mkdtemp(prefix="ot-inc-"))
    tracer = Tracer(None, "main")
    policy = SocketPolicy(FrameMac(secret, process="main"), 1 << 20, Curve(keys, process="main"))
    endpoint = Endpoint(process="main", sockets=HostSockets(ipc_dir, policy), placement={"s": "p_far"},
                        shm_prefix="omnitrio-inc-0", tracer=tracer, far=frozenset({"p_far"}))
    workers = ManualWorkers(endpoint, lambda process, main: {"main": main}, ipc_dir)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(endpoint.serve)
            endpoint.listen_tcp("tcp://127.0.0.1:*")
            workers.expect("p_far", nursery)
            yield endpoint, workers, SocketPolicy(FrameMac(secret), 1 << 20, Curve(keys))
            endpoint.stop()
    finally:
        for path in ipc_dir.iterdir():
            path.unlink()
        ipc_dir.rmdir()


async def test_messages_of_a_superseded_incarnation_are_dropped_and_counted(
    caller: tuple[Endpoint, ManualWorkers, SocketPolicy],
) -> None:
    endpoint, workers, policy = caller
    ready: list[str] = []
    entered, release = trio.Event(), trio.Event()

    async def on_ready(message: m.Ready) -> None:
        ready.append(message.stages[0])

    async def on_held(message: m.HeldReport) -> None:  # keeps the receive loop busy with one message
        entered.set()
        await release.wait()

    endpoint.on(m.Ready, on_ready)
    endpoint.on(m.HeldReport, on_held)
    ctx: zmq.Context[Any] = zmq.Context()
    worker_policy = SocketPolicy(FrameMac(policy.auth.secret), 1 << 20, policy.curve)
    sockets: list[TrioSocket] = []
    try:
        with trio.fail_after(20):
            pull = bind_pull(ctx, "tcp://127.0.0.1:*", worker_policy)
            assert endpoint.tcp_address is not None
            join = connect_push(ctx, endpoint.tcp_address, worker_policy)
            sockets += [pull, join]
            remote = workers._expected["p_far"]
            await join.send_multipart(encode(m.Join(process="p_far", address=pull.source, pid=1)))
            spec = decode(await pull.recv_multipart())
            assert isinstance(spec, m.JoinSpec)
            main = pickle.loads(spec.spec)["main"]
            assert main != endpoint.tcp_address  # the incarnation's own listener
            to_main = connect_push(ctx, main, worker_policy)
            sockets.append(to_main)
            await to_main.send_multipart(encode(m.Ready(process="p_far", stages=["accepted"])))
            await to_main.send_multipart(encode(m.HeldReport(process="p_far", request_ids=[])))
            for _ in range(3):
                await to_main.send_multipart(encode(m.Ready(process="p_far", stages=["superseded"])))
            await entered.wait()
            # The three are queued at the caller (or in its receive batch) behind the busy handler;
            # loopback TCP delivers them well within this wait.
            await trio.sleep(0.5)
            remote.kill()  # the caller gives this incarnation up
            await remote.wait()
            await trio.sleep(0)
            release.set()
            # Bounded polling: the receive loop counts each message it drops for the old incarnation.
            while workers.superseded_messages.get("p_far", 0) < 3:
                await trio.sleep(0.01)
    finally:
        release.set()
        for sock in sockets:
            sock.close()
        assert worker_policy.curve is not None
        worker_policy.curve.close(ctx)
        ctx.destroy(linger=0)
    assert ready == ["accepted"]
    assert workers.superseded_messages == {"p_far": 3}
