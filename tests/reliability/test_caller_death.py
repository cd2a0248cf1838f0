"""A caller that dies cannot leak; SIGTERM is a graceful stop; leftovers of dead runs are reclaimed.

The callers are real programs (``tests/reliability/caller_program.py``) in a
session of their own, killed or terminated from here. A run's segments are
named after its owner (``omnitrio-<pid>.<start>.<pidns>.<token>-...``), so a
program's pid is enough to find everything its run put in /dev/shm.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.comm.ownership import OWNER_FILE, Owner, boot_id, new_run_prefix, reclaim_dead_runs, write_owner_record
from omni_trio.comm.segments import SHM_DIR
from omni_trio.runtime.workers.supervisor import GRACEFUL_STOP_S
from tests.process import helpers

REPO = Path(__file__).resolve().parents[2]
#: A uid no process of this test has: files "of another user" are given it (root only).
OTHER_UID = 54321


def run_segments(owner_pid: int) -> dict[str, int]:
    """The segments (name → bytes) of the runs whose owner is ``owner_pid``."""
    found = {}
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"omnitrio-{owner_pid}."):
            try:
                found[name] = os.stat(os.path.join(SHM_DIR, name)).st_size
            except FileNotFoundError:
                continue
    return found


def segment_processes(names: dict[str, int]) -> set[str]:
    """The process indices (0: the caller) in segment names ``<run prefix>-<process>-<relay>-<n>``."""
    return {name.split("-")[2] for name in names}


@asynccontextmanager
async def caller(mode: str, base: Path, path: Path, log: Path) -> AsyncIterator[trio.Process]:
    """Run ``caller_program MODE BASE PATH`` in its own session; kill what is left of it on the way out."""
    with open(log, "wb") as stderr:
        program = await trio.lowlevel.open_process(
            [sys.executable, "-m", "tests.reliability.caller_program", mode, str(base), str(path)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
            stderr=stderr,
        )
    workers: set[int] = set()
    try:
        await helpers.wait_for_file(path, timeout=60)
        workers = helpers.workers_of(program.pid)
        yield program
    finally:
        for pid in [program.pid, *workers]:
            if helpers.running(pid):
                os.kill(pid, signal.SIGKILL)
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await program.wait()


async def wait_until(done: object, timeout: float) -> float:
    """Seconds until ``done()`` is true, checked every 5 ms (a test measuring another program's cleanup)."""
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not done():  # type: ignore[operator]
            await trio.sleep(0.005)
    return trio.current_time() - start


async def test_sigkill_of_the_caller_mid_transfer_leaves_nothing_within_2_s(ipc_base: Path, tmp_path: Path) -> None:
    log = tmp_path / "stderr"
    with trio.fail_after(120):
        async with caller("stream", ipc_base, tmp_path / "first-chunk", log) as program:
            workers = helpers.workers_of(program.pid)
            segments = run_segments(program.pid)
            assert len(workers) == 2 and helpers.ipc_dirs(ipc_base)
            # The caller's pool and both workers' pools, 64 MiB transfers among them.
            assert segment_processes(segments) == {"0", "1", "2"}, segments
            assert max(segments.values()) >= 64 << 20, segments
            os.kill(program.pid, signal.SIGKILL)
            removed = await wait_until(lambda: not (run_segments(program.pid) or helpers.ipc_dirs(ipc_base)), 10)
            elapsed = removed + await wait_until(lambda: not any(helpers.running(pid) for pid in workers), 10)
    stderr = log.read_text(errors="replace")
    # The workers cleaned up themselves (no later run reclaimed anything).
    assert stderr.count("the pipeline's process is gone") == 2, stderr
    load = os.getloadavg()[0]
    print(
        f"FIGURES caller SIGKILL: {sum(segments.values()) >> 20} MiB in {len(segments)} segments of 3 processes, "
        f"and the IPC directory removed {removed * 1000:.0f} ms after the kill, both workers exited after "
        f"{elapsed * 1000:.0f} ms (load {load:.1f})"
    )
    assert elapsed < 2.0


@pytest.mark.parametrize("target", ["caller", "process group"])
async def test_sigterm_shuts_the_pipeline_down_gracefully(ipc_base: Path, tmp_path: Path, target: str) -> None:
    """SIGTERM to the caller (a service manager's stop of the main process): the blocked request
    is aborted in its worker, the workers stop, everything is removed, the exit status is 143.
    To the whole group (a control-group stop), the workers die at once; the caller still removes
    everything and exits with 143, without a traceback."""
    pid_file = tmp_path / "pid"
    log = tmp_path / "stderr"
    with trio.fail_after(60):
        async with caller("block", ipc_base, pid_file, log) as program:
            workers = helpers.workers_of(program.pid)
            assert int(pid_file.read_text()) in workers and len(workers) == 2
            start = trio.current_time()
            if target == "caller":
                os.kill(program.pid, signal.SIGTERM)
            else:
                os.killpg(program.pid, signal.SIGTERM)
            returncode = await program.wait()
            elapsed = trio.current_time() - start
    stderr = log.read_text(errors="replace")
    assert returncode == 143, stderr
    assert "Traceback" not in stderr, stderr
    assert not [pid for pid in workers if helpers.running(pid)]
    assert helpers.ipc_dirs(ipc_base) == []
    assert run_segments(program.pid) == {}
    if target == "caller":
        assert (tmp_path / "pid.aborted").read_text() == "aborted"  # drained, not killed
        assert elapsed < GRACEFUL_STOP_S, elapsed
    print(f"FIGURES SIGTERM to the {target}: exit 143, nothing left, {elapsed * 1000:.0f} ms")


def _plant_run(base: Path, owner: Owner, tag: str, uid: int | None = None) -> tuple[Path, Path]:
    """Leftovers as a run of ``owner`` leaves them: an IPC directory with its owner record and a
    segment under its prefix (given to ``uid``, if set)."""
    prefix = f"omnitrio-{owner.pid}.{owner.start}.{owner.pidns}.{os.urandom(6).hex()}"
    ipc = base / f"omnitrio-{tag}-x"
    ipc.mkdir(mode=0o700)
    record = {"pid": owner.pid, "start": owner.start, "pidns": owner.pidns, "boot": boot_id(), "run_prefix": prefix}
    (ipc / OWNER_FILE).write_text(json.dumps(record))
    segment = Path(SHM_DIR) / f"{prefix}-1-0-p0"
    segment.write_bytes(b"\0" * 4096)
    if uid is not None:
        for path in (ipc, ipc / OWNER_FILE, segment):
            os.chown(path, uid, uid)
    return ipc, segment


async def test_a_later_pipeline_reclaims_only_runs_it_can_prove_dead(ipc_base: Path, tmp_path: Path) -> None:
    with trio.fail_after(120):
        # A dead run: caller and workers killed together (an OOM kill of the whole group), nobody
        # cleaned up. The caller is stopped first so that it cannot react to its workers' deaths.
        async with caller("hold", ipc_base, tmp_path / "dead", tmp_path / "dead.log") as dead:
            dead_workers = helpers.workers_of(dead.pid)
            os.kill(dead.pid, signal.SIGSTOP)
            for pid in dead_workers:
                os.kill(pid, signal.SIGKILL)
            await wait_until(lambda: not any(helpers.running(pid) for pid in dead_workers), timeout=10)
            os.kill(dead.pid, signal.SIGKILL)
            await dead.wait()
        (dead_dir,) = helpers.ipc_dirs(ipc_base)
        dead_segments = run_segments(dead.pid)
        assert len(dead_segments) >= 3, dead_segments
        # A reused pid: a record naming this live process, but with another start time.
        me = Owner.current()
        assert me is not None
        reused_dir, reused_segment = _plant_run(ipc_base, Owner(me.pid, me.start - 1, me.pidns), "reused")
        # The dead owner's leftovers, but another user's: not ours to remove (only root can plant them).
        foreign = _plant_run(ipc_base, Owner(dead.pid, 1, me.pidns), "foreign", OTHER_UID) if os.geteuid() == 0 else ()
        try:
            # A live run: its caller holds a stream open, its segments in use.
            async with caller("hold", ipc_base, tmp_path / "live", tmp_path / "live.log") as live:
                live_dirs = set(helpers.ipc_dirs(ipc_base)) - {dead_dir, reused_dir.name, *(p.name for p in foreign)}
                live_segments = run_segments(live.pid)
                assert len(live_dirs) == 1 and live_segments
                later = helpers.config(ipc_base, ot.StageConfig(name="a", factory_path="tests.stages.create_append",
                                                                factory={"tag": "a"}, process="p_a", terminal=True))
                async with ot.open_pipeline(later) as pipeline:
                    assert (await pipeline.submit("r0", "x"))["trail"] == ["x", "a"]
                    dirs = set(helpers.ipc_dirs(ipc_base))
                    assert dead_dir not in dirs and reused_dir.name not in dirs
                    assert not set(dead_segments) & set(run_segments(dead.pid)) and not reused_segment.exists()
                    assert live_dirs <= dirs and set(live_segments) <= set(run_segments(live.pid))
                    assert all(path.exists() for path in foreign)
                assert helpers.running(live.pid)
        finally:
            for path in foreign:
                os.chown(path, 0, 0)
            for path in (reused_segment, *foreign):
                if path.is_file():
                    path.unlink()
            for path in (reused_dir, *foreign):
                if path.is_dir():
                    (path / OWNER_FILE).unlink(missing_ok=True)
                    path.rmdir()
        # The live program was killed on the way out (both together): its leftovers go at the next start.
        await wait_until(lambda: not helpers.running(live.pid), timeout=10)
        async with ot.open_pipeline(later):
            pass
    assert helpers.ipc_dirs(ipc_base) == [] and run_segments(live.pid) == {}


def test_run_prefixes_name_their_owner() -> None:
    prefix = new_run_prefix()
    me = Owner.current()
    assert me is not None and prefix.startswith(f"omnitrio-{me.pid}.{me.start}.{me.pidns}.")
    assert me.alive() and not Owner(me.pid, me.start + 1, me.pidns).alive()
    assert Owner(me.pid, me.start + 1, me.pidns + 1).alive()  # another pid namespace: not provable


async def test_sigterm_in_process_ends_every_open_pipeline_then_restores_the_default(ipc_base: Path) -> None:
    """Two pipelines open at once (one embedded, one with a worker) share the handler: SIGTERM
    ends both, ``ot.Terminated`` (status 143) comes out, and SIGTERM's default action is back."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("the test runner handles SIGTERM itself")
    embedded = ot.PipelineConfig(
        stages=[ot.StageConfig(name="slow", factory_path="tests.stages.create_block_until_aborted", terminal=True)]
    )
    in_worker = helpers.config(
        ipc_base, ot.StageConfig(name="slow", factory_path="tests.stages.create_block_until_aborted",
                                 process="p_slow", terminal=True),
    )
    outcomes: list[str] = []

    async def submit(pipeline: ot.Pipeline, rid: str) -> None:
        try:
            await pipeline.submit(rid, "x")
        except trio.Cancelled:
            outcomes.append(rid)
            raise

    with trio.fail_after(30), pytest.raises(ot.Terminated) as caught:
        async with ot.open_pipeline(embedded) as first, ot.open_pipeline(in_worker) as second:
            # Never SIGTERM ourselves unless the runtime took it (else the test run would die).
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            async with trio.open_nursery() as nursery:
                nursery.start_soon(submit, first, "r1")
                nursery.start_soon(submit, second, "r2")
                await trio.testing.wait_all_tasks_blocked()
                os.kill(os.getpid(), signal.SIGTERM)
                await trio.sleep_forever()
    assert caught.value.code == 143
    assert sorted(outcomes) == ["r1", "r2"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_omni_trio_run_on_sigterm_exits_143_and_leaves_nothing(ipc_base: Path, tmp_path: Path) -> None:
    config = tmp_path / "pipeline.json"
    config.write_text(json.dumps({
        "stages": [{"name": "blocker", "factory_path": "tests.stages.create_block_and_report_abort",
                    "process": "p_block", "terminal": True}],
        "endpoints": {"base_path": str(ipc_base)},
    }))
    pid_file = tmp_path / "pid"
    with trio.fail_after(60):
        program = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omni_trio", "run", str(config), "--input", "x", "--app-dir", str(REPO),
             "--params", json.dumps({"pid_file": str(pid_file)})],
            cwd=REPO, start_new_session=True, stderr=subprocess.PIPE,
        )
        try:
            blocker = int(await helpers.wait_for_file(pid_file, timeout=50))
            os.kill(program.pid, signal.SIGTERM)
            returncode = await program.wait()
        finally:
            if program.returncode is None:
                program.kill()
                with trio.CancelScope(shield=True):
                    await program.wait()
        assert program.stderr is not None
        stderr = (await program.stderr.receive_some(1 << 20)).decode(errors="replace")
    assert returncode == 143 and "terminated (SIGTERM)" in stderr and "Traceback" not in stderr, stderr
    assert (tmp_path / "pid.aborted").read_text() == "aborted"
    assert not helpers.running(blocker) and helpers.ipc_dirs(ipc_base) == [] and run_segments(program.pid) == {}


def test_omni_trio_reclaim_removes_only_provably_dead_runs(ipc_base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from omni_trio import cli

    me = Owner.current()
    assert me is not None
    dead_dir, dead_segment = _plant_run(ipc_base, Owner(me.pid, me.start - 1, me.pidns), "reused")
    live_dir, live_segment = _plant_run(ipc_base, me, "live")
    try:
        assert cli.main(["reclaim", "--base", str(ipc_base)]) == 0
        out = capsys.readouterr().out
        assert f"removed {dead_dir}" in out and "1 IPC directory and 1 shared-memory segment(s)" in out, out
        assert not dead_dir.exists() and not dead_segment.exists()
        assert live_dir.exists() and live_segment.exists()
    finally:
        live_segment.unlink(missing_ok=True)
        (live_dir / OWNER_FILE).unlink(missing_ok=True)
        live_dir.rmdir()


def test_a_dead_joined_workers_directory_goes_with_its_own_segments_only(ipc_base: Path) -> None:
    """A joined worker's private directory names the worker and its own segment prefix: when the
    worker is dead and its caller alive, reclaim removes the directory and that worker's segments,
    and leaves the rest of the run's (the caller may share this /dev/shm)."""
    me = Owner.current()
    assert me is not None
    run_prefix = new_run_prefix()  # the caller's run: this live process
    dead_worker = Owner(me.pid, me.start - 1, me.pidns)
    private = ipc_base / "omnitrio-p_far-x"
    private.mkdir(mode=0o700)
    write_owner_record(private, f"{run_prefix}-2", dead_worker)
    workers_segment = Path(SHM_DIR) / f"{run_prefix}-2-p0"
    callers_segment = Path(SHM_DIR) / f"{run_prefix}-0-p0"
    for segment in (workers_segment, callers_segment):
        segment.write_bytes(b"\0" * 4096)
    try:
        reclaimed = reclaim_dead_runs([ipc_base])
        assert reclaimed.directories == [str(private)] and reclaimed.segments == [workers_segment.name]
        assert not private.exists() and not workers_segment.exists() and callers_segment.exists()
    finally:
        for segment in (workers_segment, callers_segment):
            segment.unlink(missing_ok=True)
        if private.exists():
            (private / OWNER_FILE).unlink(missing_ok=True)
            private.rmdir()
