"""A ``manual`` group with ``restart="on-failure"``, over loopback TCP (the caller on 127.0.0.1, the
worker on 127.0.0.2): the test is the orchestrator that runs the worker command; after the worker's
death the caller waits for the command to be run again, within the start-up timeout, and the
pipeline ends when nobody does (cross-namespace partitions: tests/process/test_cross_host.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from omni_trio.runtime.remote.join import KeyFile
from tests.placement import stage
from tests.process import helpers

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 4.0


def manual_config(base: Path) -> ot.PipelineConfig:
    """``first`` in the caller's process -> ``blocker`` in the manual group ``p_far`` (restarted once)."""
    return helpers.config(
        base,
        stage("first", "create_append", factory={"tag": "first"}, next="blocker"),
        stage("blocker", "create_block_and_report_pid", process="p_far", terminal=True, restart="on-failure",
              max_restarts=1),
        processes={
            "main": ot.ProcessConfig(host="127.0.0.1"),
            "p_far": ot.ProcessConfig(launcher="manual", host="127.0.0.2"),
        },
    )


async def key_file(base: Path) -> Path:
    """The key file of ``p_far`` once the caller wrote it (bounded polling: the test is outside the run)."""
    with trio.fail_after(20):
        while not (found := list(base.glob("omnitrio-*/p_far.key"))):
            await trio.sleep(0.01)
    return found[0]


async def test_a_manual_worker_nobody_restarts_ends_the_pipeline_after_the_start_timeout(
    ipc_base: Path, tmp_path: Path
) -> None:
    worker_tmp = tmp_path / "worker"  # a killed worker cannot remove its private directory
    worker_tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(worker_tmp)}
    workers: list[trio.Process] = []
    failed: list[tuple[str, float]] = []

    async def run_the_command_once() -> None:
        # What an orchestrator would run, from the key file the caller wrote.
        key = await key_file(ipc_base)
        argv = [sys.executable, "-m", "omni_trio", "worker", "--join", KeyFile.read(key).join, "--key", str(key)]
        workers.append(await trio.lowlevel.open_process(argv, env=env))

    async def submit(pipeline: ot.Pipeline, request_id: str, pid_file: Path) -> None:
        with pytest.raises(ot.StageProcessDied) as died:
            await pipeline.submit(request_id, "x", params={"pid_file": str(pid_file)})
        failed.append((died.value.process, time.monotonic()))

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run_the_command_once)
                with pytest.raises(ot.StageProcessDied) as ended:
                    async with ot.open_pipeline(manual_config(ipc_base), start_timeout=START_TIMEOUT_S) as pipeline:
                        async with trio.open_nursery() as requests:
                            requests.start_soon(submit, pipeline, "r0", tmp_path / "pid0")
                            pid = int(await helpers.wait_for_file(tmp_path / "pid0"))
                            assert pid == workers[0].pid
                            os.kill(pid, signal.SIGKILL)
                        died_at = failed[0][1]
                        assert pipeline.health().processes["p_far"] == "restarting"
                        # Submitted while the caller waits for the worker to join again: it waits, as for
                        # a restarting local process, until the restart nobody completes ends the pipeline.
                        async with trio.open_nursery() as requests:
                            requests.start_soon(submit, pipeline, "r1", tmp_path / "pid1")
                            await trio.sleep_forever()
                ended_at = time.monotonic()
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
            await worker.wait()
    assert [process for process, _ in failed] == ["p_far"]
    assert ended.value.process == "p_far" and ended.value.request_id == ""
    # It waited for a join for the start-up timeout (after the 0.1 s backoff), not less.
    assert START_TIMEOUT_S <= ended_at - died_at < START_TIMEOUT_S + 10
    assert not (tmp_path / "pid1").exists()  # r1 was never sent
    assert workers[0].returncode == -signal.SIGKILL
    # The killed worker left its private directory on its host; reclaim there removes it (and
    # its segments), as it would after an OOM kill on a real second machine.
    (left,) = worker_tmp.glob("omnitrio-p_far-*")
    reclaim = subprocess.run([sys.executable, "-m", "omni_trio", "reclaim", "--base", str(worker_tmp)],
                             capture_output=True, text=True, timeout=30, check=False)
    assert reclaim.returncode == 0 and f"removed {left}" in reclaim.stdout, reclaim.stdout + reclaim.stderr
    assert list(worker_tmp.iterdir()) == []
