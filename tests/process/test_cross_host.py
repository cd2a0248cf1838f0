"""Across hosts (issue #16): a caller in one network namespace, a ``manual`` worker in another.

The namespaces are joined by a veth pair the test creates (addresses inside the namespaces only,
10.231.N.1 and .2 of a /30; the host's interfaces and routes are not touched) and removes, with
every process in them, even when a test fails. Real processes, real CURVE over real TCP, real
shared memory on the same-namespace edges.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import attrs
import pytest
import trio

from examples import ch6_pipeline
from examples.ch4_fanin import run_experiment
from omni_trio.tracing.trace import read_trace
from tests.netns import Namespaces, run_ip, unavailable, veth_namespaces
from tests.process.helpers import shm_segments

REPO = Path(__file__).resolve().parents[2]


#: The two "hosts" of the tests.
Hosts = Namespaces


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with veth_namespaces(str(os.getpid() % 100_000)) as namespaces:
        yield namespaces


class Proc:
    """A process in a namespace, its output read line by line."""

    def __init__(self, process: trio.Process, nursery: trio.Nursery) -> None:
        self.process = process
        self.lines: dict[str, list[str]] = {"out": [], "err": []}
        self._changed = trio.Event()
        assert process.stdout is not None and process.stderr is not None
        nursery.start_soon(self._read, process.stdout, "out")
        nursery.start_soon(self._read, process.stderr, "err")

    async def _read(self, stream: trio.abc.ReceiveStream, name: str) -> None:
        pending = b""
        async for chunk in stream:
            pending += chunk
            *done, pending = pending.split(b"\n")
            self.lines[name] += [line.decode(errors="replace") for line in done]
            self._changed.set()
            self._changed = trio.Event()

    async def line(self, name: str, pattern: str, nth: int = 1) -> re.Match[str]:
        """The ``nth`` line of ``name`` (out, err) that ``pattern`` matches (waits for it)."""
        seen = 0
        while True:
            for line in self.lines[name][seen:]:
                match = re.search(pattern, line)
                if match is not None:
                    nth -= 1
                    if nth == 0:
                        return match
            seen = len(self.lines[name])
            await self._changed.wait()

    def said(self, key: str) -> str:
        """The value of the caller's ``KEY value`` line."""
        return next(line[len(key) + 1 :] for line in self.lines["out"] if line.startswith(key + " "))


@attrs.define
class Scratch:
    """The subprocesses' TMPDIR, and whether one of them had to be killed (it may have left shared memory)."""

    path: Path
    killed: bool = False


@contextlib.asynccontextmanager
async def in_namespace(namespace: str, argv: list[str], tmp: Scratch, **env: str) -> AsyncIterator[Proc]:
    """Run ``argv`` in ``namespace`` (its temporary files under ``tmp``); kill it on the way out."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp.path), **env}
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            ["ip", "netns", "exec", namespace, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
            cwd=str(REPO),
        )
        try:
            yield Proc(process, nursery)
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(20):
                    await process.wait()
                if process.returncode is None:
                    tmp.killed = True
                    process.kill()
                    await process.wait()


@pytest.fixture
def tmp_dir() -> Iterator[Scratch]:
    """The subprocesses' TMPDIR, removed with what a killed process left there; and the shared memory
    that appeared meanwhile if a process had to be killed (a caller that exits removes its own)."""
    before = shm_segments()
    scratch = Scratch(Path(tempfile.mkdtemp(prefix="ot-xhost-", dir="/tmp")))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch.path, ignore_errors=True)
        for name in shm_segments() - before if scratch.killed else ():
            with contextlib.suppress(OSError):
                os.unlink(Path("/dev/shm") / name)


#: A peer in the worker's namespace that tries the caller's join address without the run's key pair
#: (argv: join address, key file, "none" or "wrong"), sends frames, and says how libzmq refused it.
_INTRUDER = """
import json, sys, zmq
from zmq.utils.monitor import recv_monitor_message
join, key, how = sys.argv[1:4]
ctx = zmq.Context()
sock = ctx.socket(zmq.PUSH)
sock.linger = 0
if how == "wrong":  # knows the caller's public key (not a secret), presents a key pair of its own
    sock.curve_serverkey = json.load(open(key))["curve_public"].encode()
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
monitor = sock.get_monitor_socket()
sock.connect(join)
for _ in range(3):
    sock.send_multipart([b"data_ready", b"\\x80" * 64, b"forged-proof"], zmq.NOBLOCK)
failed = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
monitor.rcvtimeo = 10_000
while True:
    event = recv_monitor_message(monitor)["event"]
    if event & (failed | zmq.EVENT_DISCONNECTED):
        print("REFUSED", zmq.Event(event).name, flush=True)
        break
"""


async def _start_worker(
    caller: Proc, hosts: Hosts, tmp: Scratch, nth: int = 1, process: str = "", namespace: str | None = None
) -> contextlib.AbstractAsyncContextManager[Proc]:
    """The worker command the caller logged (the ``nth`` time: it logs it again for each restart; of
    ``process``, a replica's name, whose key file is named after it, if given), run in ``namespace``
    (the far one by default)."""
    key_file = rf"\S+/{re.escape(process)}\.key" if process else r"\S+"
    match = await caller.line("err", rf"command='omni-trio worker --join (\S+) --key ({key_file})'", nth)
    join, key = match.groups()
    assert join.startswith(f"tcp://{hosts.near_ip}:")
    assert os.stat(key).st_mode & 0o777 == 0o600
    argv = [sys.executable, "-m", "omni_trio", "worker", "--join", join, "--key", key]
    return in_namespace(namespace or hosts.far, argv, tmp)


def _caller(scenario: str, hosts: Hosts, *more: str) -> list[str]:
    return [sys.executable, "-m", "tests.crosshost_caller", scenario, hosts.near_ip, hosts.far_ip, *more]


async def test_the_chapters_fan_in_across_namespaces_matches_the_local_run(hosts: Hosts, tmp_dir: Scratch) -> None:
    expected = await run_experiment("embedded")
    with trio.fail_after(60):
        async with in_namespace(hosts.near, _caller("fanin", hosts), tmp_dir) as caller:
            async with await _start_worker(caller, hosts, tmp_dir) as worker:
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
            assert worker.process.returncode == 0, worker.lines["err"][-20:]
    assert json.loads(caller.said("RESULT")) == expected
    assert json.loads(caller.said("REFUSED")) == {"main": 0, "p_count": 0, "p_upper": 0}


async def test_peers_without_the_runs_key_are_refused_before_any_frame(hosts: Hosts, tmp_dir: Scratch) -> None:
    expected = await run_experiment("embedded")
    with trio.fail_after(60):
        async with in_namespace(hosts.near, _caller("fanin", hosts), tmp_dir) as caller:
            match = await caller.line("err", r"command='omni-trio worker --join (\S+) --key (\S+)'")
            join, key = match.groups()
            refusals = {}
            for how in ("none", "wrong"):
                async with in_namespace(hosts.far, [sys.executable, "-c", _INTRUDER, join, key, how], tmp_dir) as peer:
                    refusals[how] = (await peer.line("out", r"^REFUSED (\S+)")).group(1)
            await caller.line("err", r"curve_peer_refused .*refused=1")  # the caller's ZAP handler, for "wrong"
            async with await _start_worker(caller, hosts, tmp_dir):
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
    # Both were dropped by libzmq (the wrong key by the ZAP handler): the run's proof check, which
    # counts every message it sees without a valid proof, saw none of their frames.
    assert refusals["wrong"] == "HANDSHAKE_FAILED_AUTH", refusals
    assert json.loads(caller.said("REFUSED")) == {"main": 0, "p_count": 0, "p_upper": 0}
    assert json.loads(caller.said("RESULT")) == expected


async def test_tensors_go_over_tcp_across_namespaces_and_shm_within(hosts: Hosts, tmp_dir: Scratch) -> None:
    trace = tmp_dir.path / "run.jsonl"
    with trio.fail_after(60):
        async with in_namespace(hosts.near, _caller("tensors", hosts), tmp_dir, OMNI_TRIO_TRACE=str(trace)) as caller:
            async with await _start_worker(caller, hosts, tmp_dir) as worker:
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
    n = 1 << 20
    arange_sum = n * (n - 1) / 2
    results = json.loads(caller.said("RESULT"))
    assert [(r["far"]["sum"], r["near"]["sum"], r["far"]["numel"]) for r in results] == [
        (2 * arange_sum, 3 * arange_sum, n)
    ] * 3
    assert results[0]["far"]["pid"] == worker.process.pid  # ip netns exec execs the worker itself
    edges = {
        (e["from_stage"], e["to_stage"]): e["transport"]
        for e in read_trace(trace)
        if e.get("event") == "comm_payload_send"
    }
    assert edges == {("make", "far"): "tcp", ("far", "join"): "tcp", ("make", "near"): "shm", ("near", "join"): "shm"}
    assert json.loads(caller.said("REFUSED")) == {"main": 0, "p_far": 0, "p_near": 0}


async def test_the_chapters_transport_experiment_across_namespaces(hosts: Hosts, tmp_dir: Scratch) -> None:
    # The chapter's transport experiment (its "big" run: a 64 KiB chunk over the inline limit), once on
    # this host and once with ``far`` in the other namespace: the same result; what went through shared
    # memory locally goes over TCP between the namespaces, the rest is unchanged.
    local_trace = tmp_dir.path / "local.jsonl"
    with trio.fail_after(60):
        expected = await ch6_pipeline.run(True, local_trace)
    trace = tmp_dir.path / "run.jsonl"
    with trio.fail_after(60):
        async with in_namespace(hosts.near, _caller("transport", hosts, str(trace)), tmp_dir) as caller:
            async with await _start_worker(caller, hosts, tmp_dir):
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
    assert json.loads(caller.said("RESULT")) == expected
    local = ch6_pipeline.summarize(local_trace)
    assert json.loads(caller.said("SUMMARY")) == [line.replace("shm", "tcp") for line in local]
    assert [line.split()[-1] for line in local] == ["local_object", "shm", "shm", "inline", "shm"]


async def test_worker_to_worker_edges_cross_namespaces_over_tcp(hosts: Hosts, tmp_dir: Scratch) -> None:
    # caller -> p_a (local worker) -> p_far (the other namespace) -> p_b (local worker) -> caller.
    trace = tmp_dir.path / "run.jsonl"
    env = {"OMNI_TRIO_TRACE": str(trace), "OMNI_TRIO_LOG_LEVEL": "info"}
    with trio.fail_after(90):
        async with in_namespace(hosts.near, _caller("chain", hosts), tmp_dir, **env) as caller:
            # Both local workers listen on TCP (they have an edge with the far worker) before it joins.
            pattern = r"tcp_listening .*address=(\S+) pid=\d+ process={}$"
            with trio.move_on_after(60) as waiting:  # ~1 s when all is well; say what the caller logged if not
                listening = {
                    process: (await caller.line("err", pattern.format(process))).group(1) for process in ("p_a", "p_b")
                }
            assert not waiting.cancelled_caught, "\n".join(caller.lines["err"][-60:])
            assert all(address.startswith(f"tcp://{hosts.near_ip}:") for address in listening.values()), listening
            # A peer with a key pair of its own is refused by the local worker's ZAP handler.
            key = (await caller.line("err", r"--key (\S+)'")).group(1)
            argv = [sys.executable, "-c", _INTRUDER, listening["p_b"], key, "wrong"]
            async with in_namespace(hosts.far, argv, tmp_dir) as peer:
                refused = (await peer.line("out", r"^REFUSED (\S+)")).group(1)
            await caller.line("err", r"curve_peer_refused .*process=p_b refused=1")
            async with await _start_worker(caller, hosts, tmp_dir) as worker:
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
            assert worker.process.returncode == 0, worker.lines["err"][-20:]
    assert refused == "HANDSHAKE_FAILED_AUTH"
    n = 1 << 20
    results = json.loads(caller.said("RESULT"))
    assert [(r["sum"], r["numel"]) for r in results] == [(30 * n * (n - 1) / 2, n)] * 3
    edges = {
        (e["from_stage"], e["to_stage"]): e["transport"]
        for e in read_trace(trace)
        if e.get("event") == "comm_payload_send"
    }
    assert edges == {("make", "a"): "shm", ("a", "far"): "tcp", ("far", "b"): "tcp", ("b", "total"): "shm"}
    assert json.loads(caller.said("REFUSED")) == {"main": 0, "p_a": 0, "p_b": 0, "p_far": 0}


async def test_a_restarted_local_worker_is_found_again_by_the_remote_one(hosts: Hosts, tmp_dir: Scratch) -> None:
    # p_a (local, restart="on-failure") <-> p_far (the other namespace): p_a dies on r1 and comes back
    # at the same TCP port, where the far worker's connection (its ACKs to p_a) finds it again.
    trace = tmp_dir.path / "run.jsonl"
    env = {"OMNI_TRIO_TRACE": str(trace), "OMNI_TRIO_LOG_LEVEL": "info"}
    with trio.fail_after(90):
        async with in_namespace(hosts.near, _caller("restart", hosts), tmp_dir, **env) as caller:
            async with await _start_worker(caller, hosts, tmp_dir) as worker:
                await caller.process.wait()
            assert caller.process.returncode == 0, caller.lines["err"][-20:]
            assert worker.process.returncode == 0, worker.lines["err"][-20:]
    pattern = re.compile(r"tcp_listening .*address=(\S+) pid=(\d+) process=p_a$")
    incarnations = [match.groups() for line in caller.lines["err"] if (match := pattern.search(line))]
    assert len(incarnations) == 2 and incarnations[0][0] == incarnations[1][0], incarnations
    assert incarnations[0][1] != incarnations[1][1]
    assert caller.said("FAILED") == "StageProcessDied"
    n = 1 << 20
    results = json.loads(caller.said("RESULT"))
    assert [(r["sum"], r["numel"]) for r in results] == [(30 * n * (n - 1) / 2, n)] * 2
    sends = [(e["request_id"], e["from_stage"], e["transport"]) for e in read_trace(trace)
             if e.get("event") == "comm_payload_send" and e["to_stage"] in ("far", "b")]
    assert ("r2", "a", "tcp") in sends and ("r2", "far", "tcp") in sends, sends


async def test_killing_the_remote_worker_fails_its_request_within_a_second(hosts: Hosts, tmp_dir: Scratch) -> None:
    with trio.fail_after(60):
        async with (
            in_namespace(hosts.near, _caller("killed", hosts), tmp_dir) as caller,
            await _start_worker(caller, hosts, tmp_dir) as worker,
        ):
            await worker.line("err", "BLOCKING")
            killed_at = time.monotonic()
            worker.process.kill()
            await caller.line("out", "^FAILED ")
    error, at = caller.said("FAILED").split()
    assert error == "StageProcessDied", caller.said("ERROR")
    print(f"\nFIGURES kill_to_failure_s={float(at) - killed_at:.3f}")
    assert float(at) - killed_at < 1.0, caller.lines["err"][-20:]


async def test_a_cut_link_fails_the_remote_workers_request_through_heartbeats(hosts: Hosts, tmp_dir: Scratch) -> None:
    # No process dies and no socket closes: only ZMTP heartbeats (every 250 ms, 1 s timeout) tell.
    try:
        with trio.fail_after(60):
            async with (
                in_namespace(hosts.near, _caller("killed", hosts), tmp_dir) as caller,
                await _start_worker(caller, hosts, tmp_dir) as worker,
            ):
                await worker.line("err", "BLOCKING")
                cut_at = time.monotonic()
                run_ip("-n", hosts.far, "link", "set", hosts.far, "down")
                await caller.line("out", "^FAILED ")
                # The worker notices too, and exits by itself.
                await worker.line("err", "the connection to the caller dropped; exiting")
    finally:
        run_ip("-n", hosts.far, "link", "set", hosts.far, "up")
    error, at = caller.said("FAILED").split()
    assert error == "StageProcessDied"
    print(f"\nFIGURES cut_to_failure_s={float(at) - cut_at:.3f}")
    assert float(at) - cut_at < 2.0, caller.lines["err"][-20:]


def _shm_mapped(pid: int) -> set[str]:
    """The /dev/shm files process ``pid`` has mapped."""
    with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
        return {line.split()[-1] for line in maps if "/dev/shm/" in line}


async def test_a_partition_heals_the_worker_rejoins_and_nothing_of_it_is_left(hosts: Hosts, tmp_dir: Scratch) -> None:
    # restart="on-failure" on the remote group; the test is the orchestrator that runs its command again.
    try:
        with trio.fail_after(90):
            async with in_namespace(hosts.near, _caller("partition", hosts), tmp_dir) as caller:
                async with await _start_worker(caller, hosts, tmp_dir) as first:
                    pid = int((await first.line("err", r"BLOCKING (\d+)")).group(1))
                    assert pid == first.process.pid
                    segments = _shm_mapped(pid)
                    assert segments, "the blocked request holds a slot of the worker's pool"
                    cut_at = time.monotonic()
                    run_ip("-n", hosts.far, "link", "set", hosts.far, "down")
                    await caller.line("out", "^FAILED ")
                    # Cut off, the worker notices (heartbeats) and exits by itself, releasing its segments.
                    await first.process.wait()
                    exited_at = time.monotonic()
                    await first.line("err", "the connection to the caller dropped; exiting")
                assert first.process.returncode == 1, first.lines["err"][-20:]
                assert not [name for name in segments if os.path.exists(name)]
                run_ip("-n", hosts.far, "link", "set", hosts.far, "up")
                # The caller logged the command again; the same key file rejoins as a new incarnation.
                async with await _start_worker(caller, hosts, tmp_dir, nth=2) as second:
                    await caller.process.wait()
                assert caller.process.returncode == 0, caller.lines["err"][-20:]
                assert second.process.returncode == 0, second.lines["err"][-20:]
    finally:
        run_ip("-n", hosts.far, "link", "set", hosts.far, "up")
    error, at = caller.said("FAILED").split()
    assert error == "StageProcessDied"
    print(f"\nFIGURES cut_to_failure_s={float(at) - cut_at:.3f} cut_to_worker_exit_s={exited_at - cut_at:.3f}")
    assert float(at) - cut_at < 2.5, caller.lines["err"][-20:]
    keys = re.findall(r"--key (\S+)'", "\n".join(caller.lines["err"]))
    assert len(keys) == 2 and keys[0] == keys[1]
    n = 1 << 20
    far = [r["far"] for r in json.loads(caller.said("RESULT"))]
    assert [(r["sum"], r["numel"]) for r in far] == [(n * (n - 1), n)] * 2  # 2 * sum(arange(n)), exact
    assert far[1]["pid"] == second.process.pid != pid
    # Nothing of the old incarnation is left on the caller's side: no request, transfer or credit held.
    state = json.loads(caller.said("STATE"))
    # The cut-off incarnation exited before the link came back: nothing of it arrived to be dropped.
    assert state == {"idle": True, "live": 0, "health": {"main": "ready", "p_far": "ready", "p_near": "ready"},
                     "stages": {}, "superseded": {}}, state


async def test_manual_replicas_on_two_hosts_fail_alone_and_come_back(hosts: Hosts, tmp_dir: Scratch) -> None:
    # p_rep@r0 on the caller's host (its namespace), p_rep@r1 on the far one, each started from its own
    # command and key file; the test is the orchestrator that kills p_rep@r1 and runs its command again.
    trace = tmp_dir.path / "run.jsonl"
    with trio.fail_after(90):
        async with in_namespace(hosts.near, _caller("replicas", hosts), tmp_dir, OMNI_TRIO_TRACE=str(trace)) as caller:
            async with (
                await _start_worker(caller, hosts, tmp_dir, process="p_rep@r0", namespace=hosts.near) as r0,
                await _start_worker(caller, hosts, tmp_dir, process="p_rep@r1") as r1,
            ):
                await caller.line("out", "^HELD")
                await r1.line("err", r"^HELD 1 ")  # it holds one of them
                tmp_dir.killed = True
                r1.process.kill()
                await caller.line("out", "^DEGRADED ")
                async with await _start_worker(caller, hosts, tmp_dir, nth=2, process="p_rep@r1") as again:
                    await caller.process.wait()
                assert caller.process.returncode == 0, caller.lines["err"][-20:]
            assert (r0.process.returncode, again.process.returncode) == (0, 0), r0.lines["err"][-20:]
    pids = {0: r0.process.pid, 1: r1.process.pid}
    served = json.loads(caller.said("SERVED"))
    assert {replica for replica, _ in served} == {0, 1}, served  # least in flight spread the load
    assert all(pid == pids[replica] for replica, pid in served), (served, pids)
    # Only the killed replica's request failed; replica 0 served everything meanwhile, then r1 came back.
    failed = json.loads(caller.said("FAILED"))
    assert list(failed.values()) == ["p_rep@r1"], failed
    degraded = json.loads(caller.said("DEGRADED"))
    assert degraded["down"] == ["p_rep@r1"] and degraded["served"] == [0, 0, 0], degraded
    assert degraded["health"] == {"main": "ready", "p_rep@r0": "ready", "p_rep@r1": "restarting"}, degraded
    assert json.loads(caller.said("BACK")) == [1, again.process.pid]
    state = json.loads(caller.said("STATE"))
    assert state["idle"] and state["stages"] == ["make", "where@r0", "where@r1"], state
    assert state["health"] == {"main": "ready", "p_rep@r0": "ready", "p_rep@r1": "ready"}, state
    assert sorted(state["outcomes"].values()) == ["aborted", "p_rep@r1"], state
    assert {"p_rep@r0", "p_rep@r1"} <= set(state["metrics"]), state  # /metrics names each replica
    # The replica on the caller's host gets its tensors through shared memory, the other over TCP.
    sends = [e for e in read_trace(trace) if e.get("event") == "comm_payload_send" and e["from_stage"] == "make"]
    assert {(e["to_stage"], e["transport"]) for e in sends} == {("where@r0", "shm"), ("where@r1", "tcp")}, sends
