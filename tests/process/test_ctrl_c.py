"""Ctrl-C on a program serving a multi-process pipeline: everything it started goes away.

The program runs in its own session, and SIGINT goes to its whole process
group, as a terminal's Ctrl-C does; worker processes ignore it and are shut
down by the runtime.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import trio

from tests.process import helpers

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import signal
    import sys
    import trio
    import omni_trio as ot

    # Ctrl-C as in a terminal, whatever the test runner inherited (a background job of a shell
    # without job control, or under nohup, starts with SIGINT ignored, and so would this program).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    base, pid_file = sys.argv[1], sys.argv[2]
    config = ot.PipelineConfig(
        stages=[
            ot.StageConfig(name="a", factory_path="tests.stages.create_append", factory={"tag": "a"},
                           process="p_a", next="blocker"),
            ot.StageConfig(name="blocker", factory_path="tests.stages.create_block_and_report_pid",
                           process="p_block", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base),
    )

    async def main():
        async with ot.open_pipeline(config) as pipeline:
            await pipeline.submit("r0", "x", params={"pid_file": pid_file})

    trio.run(main)
    """
)


async def test_ctrl_c_stops_workers_and_removes_what_the_run_created(ipc_base: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    shm_before = helpers.shm_segments()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with trio.fail_after(60):
        program = await trio.lowlevel.open_process(
            [sys.executable, "-c", PROGRAM, str(ipc_base), str(pid_file)],
            cwd=REPO,
            env=env,
            start_new_session=True,
            stderr=subprocess.PIPE,
        )
        blocker = int(await helpers.wait_for_file(pid_file, timeout=50))  # the request is in flight
        workers = helpers.workers_of(program.pid)
        assert blocker in workers and len(workers) == 2
        workers |= helpers.templates_of(program.pid)  # they must go too
        assert helpers.ipc_dirs(ipc_base)  # the run's IPC directory exists while it runs
        os.killpg(program.pid, signal.SIGINT)
        returncode = await program.wait()
        assert program.stderr is not None
        stderr = (await program.stderr.receive_some(1 << 20)).decode(errors="replace")
    assert returncode != 0 and "KeyboardInterrupt" in stderr, stderr
    assert not [pid for pid in workers if helpers.running(pid)]
    assert helpers.ipc_dirs(ipc_base) == []
    assert helpers.shm_segments() - shm_before == set()
