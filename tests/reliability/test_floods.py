"""A process keeps serving whatever connections do to it: what a same-user process that can connect to a
run's sockets does with connections alone (docs/reliability.md, "Connections").

- Idle connections, more than the process may hold descriptors (its soft RLIMIT_NOFILE lowered to
  256), to the worker's and the caller's inbox: neither process ends; each holds at most its cap of
  unproven connections and refuses the rest, counted in ``stats().refused_connections``; the pipeline
  serves throughout.
- Half-sent messages from many connections (each proved with a sealed first message): the worker's
  memory grows by at most ``endpoints.max_unfinished_bytes``; the connections over it are closed at
  once, the others when their message is ``endpoints.message_timeout_s`` late; all counted.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from omni_trio.control.sockets.framing import message_head
from tests.placement import stage
from tests.process import helpers

#: The soft descriptor limit the caller and its workers run under here (the probes' 1,024 lowered).
NOFILE = 256
#: Connections the attacker opens to each inbox: more than the limit.
FLOOD = 400

#: Opens ``count`` connections to each path given, says so, and holds them until its stdin closes.
_ATTACKER = """
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
count, paths = int(sys.argv[1]), sys.argv[2:]
held = []
for path in paths:
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        held.append(sock)
print("ready", flush=True)
sys.stdin.read()
"""


def _two_stages(base: Path, **endpoints: Any) -> ot.PipelineConfig:
    return ot.PipelineConfig(
        stages=[
            stage("a", "create_append", factory={"tag": "a"}, next="b"),  # in the caller's process
            stage("b", "create_append", factory={"tag": "b"}, process="p_b", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=str(base), **endpoints),
    )


@contextlib.contextmanager
def _descriptor_limit(soft: int) -> Iterator[None]:
    """This process (the caller) and the workers it starts run under ``soft`` descriptors."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


def _status(pid: int, field: str) -> int:
    (kib,) = re.findall(rf"{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(kib) << 10


async def test_more_idle_connections_than_descriptors_end_no_process(ipc_base: Path) -> None:
    attacker = None
    with trio.fail_after(60), _descriptor_limit(NOFILE):
        async with ot.open_pipeline(_two_stages(ipc_base)) as pipeline:
            assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
            (pid,) = helpers.worker_processes()
            assert resource.prlimit(pid, resource.RLIMIT_NOFILE)[0] == NOFILE
            ipc = helpers.ipc_dir(ipc_base)
            try:
                attacker = subprocess.Popen(
                    [sys.executable, "-c", _ATTACKER, str(FLOOD), str(ipc / "p_b.sock"), str(ipc / "main.sock")],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                )
                assert attacker.stdout is not None
                assert await trio.to_thread.run_sync(attacker.stdout.readline) == b"ready\n"
                # Each inbox accepted every waiting connection before it read the request's messages.
                for i in range(3):
                    assert await pipeline.submit(f"during-{i}", f"y{i}") == {"trail": [f"y{i}", "a", "b"]}
                refused = (await pipeline.stats()).refused_connections
                worker_fds = len(os.listdir(f"/proc/{pid}/fd"))
                cap = NOFILE // 4  # the default 64 unproven connections, within a quarter of the limit
                assert FLOOD - cap <= refused["p_b"] <= FLOOD and FLOOD - cap <= refused["main"] <= FLOOD, refused
                assert worker_fds < NOFILE - 64, worker_fds
            finally:
                if attacker is not None:
                    attacker.kill()
                    attacker.wait()
            assert await pipeline.submit("after", "z") == {"trail": ["z", "a", "b"]}
            assert helpers.worker_processes() == {pid: helpers.worker_processes()[pid]}
            stats = await pipeline.stats()
            assert stats.idle and stats.refused_frames == {"main": 0, "p_b": 0}
    print(f"\nFIGURES idle_flood: nofile={NOFILE} connections_per_inbox={FLOOD} refused={refused} "
          f"worker_fds_during={worker_fds} worker_restarts=0")


#: The limits of the half-sent messages test.
MESSAGE_BYTES = 16 << 20
UNFINISHED_BYTES = 32 << 20
MESSAGE_TIMEOUT_S = 3.0
#: Connections that each leave a message of almost ``MESSAGE_BYTES`` half-sent.
HOARDERS = 16


async def _hoard(path: Path, proof: list[bytes], started: list[float], closed: list[float]) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    try:
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(message_head([len(f) for f in proof]) + b"".join(proof))
            started.append(trio.current_time())
            await stream.send_all(message_head([MESSAGE_BYTES - 64]) + b"\0" * (MESSAGE_BYTES - (1 << 20)))
        with contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some(1):
                pass
        closed.append(trio.current_time())
    finally:
        sock.close()


async def test_half_sent_messages_hold_at_most_the_cap_and_are_dropped_when_late(ipc_base: Path) -> None:
    config = _two_stages(ipc_base, max_message_bytes=MESSAGE_BYTES, max_unfinished_bytes=UNFINISHED_BYTES,
                         message_timeout_s=MESSAGE_TIMEOUT_S)
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
            (pid,) = helpers.worker_processes()
            ipc = helpers.ipc_dir(ipc_base)
            # Sealed with the run's secret (a process that reads the run's files): proven connections.
            proof = [bytes(f) for f in helpers.run_auth(ipc).seal([b"no_such_message", b""])]
            rss_before = _status(pid, "VmRSS")
            started: list[float] = []
            closed: list[float] = []
            async with trio.open_nursery() as nursery:
                for _ in range(HOARDERS):
                    nursery.start_soon(_hoard, ipc / "p_b.sock", proof, started, closed)
            peak = _status(pid, "VmHWM")
            assert len(closed) == HOARDERS
            late = max(closed) - min(started)
            assert late >= MESSAGE_TIMEOUT_S * 0.9, late  # the survivors waited for their time limit
            assert peak - rss_before < UNFINISHED_BYTES + (24 << 20), (rss_before >> 20, peak >> 20)
            assert await pipeline.submit("after", "z") == {"trail": ["z", "a", "b"]}
            stats = await pipeline.stats()
            assert stats.refused_connections["p_b"] == HOARDERS, stats.refused_connections
            assert stats.idle and helpers.worker_processes().keys() == {pid}
    print(f"\nFIGURES half_sent: connections={HOARDERS} message_bytes={MESSAGE_BYTES} cap={UNFINISHED_BYTES} "
          f"worker_rss_mib before={rss_before >> 20} peak={peak >> 20} last_closed_after_s={late:.1f} "
          f"refused={stats.refused_connections['p_b']}")
