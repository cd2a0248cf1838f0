"""Restart policy: a worker process with ``restart="on-failure"`` is started again after it died.

The requests live at the death fail with StageProcessDied, the pipeline keeps serving through the
new process (same name and socket path: peers reconnect on their own), and once ``max_restarts``
is used up a death ends the pipeline as it does without the policy. After every test the autouse
fixture of conftest.py checks that nothing was left behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers
from tests.process.helpers import submit_and_kill


def pipeline_config(base: Path, max_restarts: int = 3, restart_backoff_s: float = 0.1) -> ot.PipelineConfig:
    """Main -> ``p_first`` (appends, never restarted) -> ``p_block`` (reports its pid, blocks; restartable
    after ``restart_backoff_s``)."""
    return helpers.config(
        base,
        stage("first", "create_append", factory={"tag": "first"}, process="p_first", next="blocker"),
        stage(
            "blocker",
            "create_block_and_report_pid",
            process="p_block",
            terminal=True,
            restart="on-failure",
            max_restarts=max_restarts,
            restart_backoff_s=restart_backoff_s,
        ),
    )


async def test_killed_worker_is_restarted_and_serves_later_requests(ipc_base: Path, tmp_path: Path) -> None:
    # The restart must outlast the stats call and r-late's deadline below: a worker forked from
    # the template is ready a few ms after the backoff, so the backoff sets the window.
    config = pipeline_config(ipc_base, restart_backoff_s=2.0)
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            first_pid = await submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            other_workers = set(helpers.worker_processes())
            # Restarting (the backoff alone lasts 2 s): its stage reports unhealthy and holds nothing.
            restarting = await pipeline.stats()
            assert restarting.stages["blocker"].healthy is False and restarting.stages["first"].healthy
            # A submit waits for the restart; its deadline still ends that wait.
            with pytest.raises(ot.RequestTimeout):
                await pipeline.submit("r-late", "y", params={"pid_file": str(tmp_path / "late")}, deadline=0.05)
            # Submitted while the worker restarts: it waits until the new process is ready.
            params: dict[str, Any] = {"pid_file": str(tmp_path / "pid1"), "block": False}
            assert await pipeline.submit("r1", "y", params=params) == {"trail": ["blocked"]}
            second_pid = int((tmp_path / "pid1").read_text())
            assert second_pid != first_pid
            assert second_pid in helpers.worker_processes()
            assert first_pid not in helpers.worker_processes()
            assert other_workers <= set(helpers.worker_processes())  # p_first was not restarted
            # The restarted stage serves more than one request, and the pipeline ends idle.
            params["pid_file"] = str(tmp_path / "pid2")
            assert await pipeline.submit("r2", "z", params=params) == {"trail": ["blocked"]}
            assert int((tmp_path / "pid2").read_text()) == second_pid
            assert not (tmp_path / "late").exists()  # the timed-out request was never sent
            stats = await pipeline.stats()
            assert stats.idle, stats
            assert all(s.healthy for s in stats.stages.values()), stats


async def test_the_caller_hears_of_the_death_once_the_other_processes_dropped_the_request(
    ipc_base: Path, tmp_path: Path
) -> None:
    # split fans out to the blocker (restartable, killed) and to a holder in another process that
    # keeps the request until it is aborted: when the caller sees StageProcessDied, the holder has
    # already dropped it.
    config = helpers.config(
        ipc_base,
        stage("split", "create_append", factory={"tag": "split"}, process="p_first", next=["blocker", "holder"]),
        stage("blocker", "create_block_and_report_pid", process="p_block", next="join", restart="on-failure"),
        stage("holder", "create_block_until_aborted", process="p_hold", next="join"),
        stage("join", "create_passthrough", process="p_first", wait_for=["blocker", "holder"],
              merge_fn="tests.stages.merge_trails", terminal=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            await submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            # No waiting: the abort broadcast finished before the caller heard of the failure.
            stats = await pipeline.stats()
            assert stats.stages["holder"].idle and stats.stages["join"].idle, stats
            assert stats.live_requests == 0


async def test_dying_after_max_restarts_ends_the_pipeline(ipc_base: Path, tmp_path: Path) -> None:
    config = pipeline_config(ipc_base, max_restarts=1)
    with trio.fail_after(60), pytest.raises(ot.StageProcessDied) as ended:
        async with ot.open_pipeline(config) as pipeline:
            first_pid = await submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            second_pid = await submit_and_kill(pipeline, "r1", tmp_path / "pid1")  # the one restart
            assert second_pid != first_pid
            await trio.sleep_forever()  # the second death ends the pipeline
    final = ended.value
    assert (final.request_id, final.process, final.pid, final.returncode) == ("", "p_block", second_pid, -9)
    assert not helpers.worker_processes()


async def test_max_restarts_zero_ends_the_pipeline_at_the_first_death(ipc_base: Path, tmp_path: Path) -> None:
    config = pipeline_config(ipc_base, max_restarts=0)
    with trio.fail_after(60), pytest.raises(ot.StageProcessDied) as ended:
        async with ot.open_pipeline(config) as pipeline:
            pid = await submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            await trio.sleep_forever()
    assert (ended.value.process, ended.value.pid) == ("p_block", pid)


def test_stages_of_one_process_must_agree_on_the_restart_policy() -> None:
    with pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[
                stage("a", "create_append", factory={"tag": "a"}, process="p", next="b", restart="on-failure"),
                stage("b", "create_append", factory={"tag": "b"}, process="p", terminal=True, max_restarts=5),
            ]
        )
    paths = sorted(problem.path for problem in error.value.problems)
    assert paths == ["stages[1].max_restarts", "stages[1].restart"]


def test_restart_settings_are_validated() -> None:
    with pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[
                stage("a", "create_append", factory={"tag": "a"}, next="b", restart="always", max_restarts=-1,
                      restart_backoff_s=-0.5),
                stage("b", "create_append", factory={"tag": "b"}, terminal=True, restart_backoff_s="1s"),  # type: ignore[arg-type]
            ]
        )
    problems = sorted(str(problem) for problem in error.value.problems)
    assert [p.split(":")[0] for p in problems] == [
        "stages[0].max_restarts", "stages[0].restart", "stages[0].restart_backoff_s", "stages[1].restart_backoff_s",
    ]
    assert "stages[0].restart_backoff_s: expected a number of seconds >= 0, got -0.5" in problems


def test_stages_of_one_process_must_agree_on_the_restart_backoff() -> None:
    with pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[
                stage("a", "create_append", factory={"tag": "a"}, process="p", next="b", restart_backoff_s=1.0),
                stage("b", "create_append", factory={"tag": "b"}, process="p", terminal=True),
            ]
        )
    (problem,) = error.value.problems
    assert problem.path == "stages[1].restart_backoff_s", problem
    assert "all stages of one process share its restart policy" in str(problem)
