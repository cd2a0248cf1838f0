"""Workers forked from a pipeline's template process (``start_method="template"``, the default).

Real processes throughout: the template, its forked workers, their deaths and
restarts. After every test the autouse fixture of conftest.py checks that no
worker, template, zombie, IPC directory or segment was left behind.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers

EFFECTS = "tests.process.import_effects"


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def noisy_pipeline(base: Path, **kwargs: object) -> ot.PipelineConfig:
    """Main -> ``p_a`` (appends) -> ``p_noisy`` (writes a marker to stderr when built, returns its pid)."""
    return helpers.config(
        base,
        stage("a", "create_append", factory={"tag": "a"}, process="p_a", next="noisy"),
        ot.StageConfig(
            name="noisy", factory_path=f"{EFFECTS}.create_noisy", factory={"marker": "noisy-built"},
            process="p_noisy", terminal=True,
        ),
        **kwargs,
    )


def restart_pipeline(base: Path) -> ot.PipelineConfig:
    """Main -> ``p_first`` (appends) -> ``p_block`` (reports its pid, blocks; restartable)."""
    return helpers.config(
        base,
        stage("first", "create_append", factory={"tag": "first"}, process="p_first", next="blocker"),
        stage("blocker", "create_block_and_report_pid", process="p_block", terminal=True, restart="on-failure"),
    )


async def test_workers_are_forked_from_one_template_and_write_to_our_stderr(
    ipc_base: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(noisy_pipeline(ipc_base)) as pipeline:
            (template,) = helpers.template_processes()
            workers = helpers.worker_processes()
            assert len(workers) == 2 and all(_ppid(pid) == template for pid in workers)
            # ps shows which worker is which, as for a spawned one.
            assert sorted(cmd.split()[-1].rsplit("/", 1)[-1] for cmd in workers.values()) == [
                "p_a.spec", "p_noisy.spec"
            ]
            result = await pipeline.submit("r0", "x")
            assert result["pid"] in workers
    err = capfd.readouterr().err
    assert f"noisy-built {result['pid']}" in err  # the worker's stderr is the caller's
    assert not helpers.template_processes()


async def test_a_forked_worker_death_is_noticed_with_its_exit_status_and_it_restarts_from_the_template(
    ipc_base: Path, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(restart_pipeline(ipc_base)) as pipeline:
            (template,) = helpers.template_processes()
            killed = await helpers.submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            params = {"pid_file": str(tmp_path / "pid1"), "block": False}
            assert await pipeline.submit("r1", "y", params=params) == {"trail": ["blocked"]}
            restarted = int((tmp_path / "pid1").read_text())
            assert restarted != killed and _ppid(restarted) == template
            assert helpers.template_processes().keys() == {template}


async def test_a_dead_template_is_reported_its_workers_keep_serving_and_a_new_one_forks_restarts(
    ipc_base: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(restart_pipeline(ipc_base)) as pipeline:
            (template,) = helpers.template_processes()
            os.kill(template, signal.SIGKILL)
            while template in helpers.template_processes():  # bounded by fail_after: the runtime reaps it
                await trio.sleep(0.01)
            params = {"pid_file": str(tmp_path / "pid0"), "block": False}
            assert await pipeline.submit("r0", "y", params=params) == {"trail": ["blocked"]}
            # Its workers live on; the one killed now was forked by the dead template, so
            # its death is still seen (its pidfd) but its exit status is unknown.
            await helpers.submit_and_kill(pipeline, "r1", tmp_path / "pid1", returncode=None)
            params = {"pid_file": str(tmp_path / "pid2"), "block": False}
            assert await pipeline.submit("r2", "y", params=params) == {"trail": ["blocked"]}
            (replacement,) = helpers.template_processes()
            assert replacement != template and _ppid(int((tmp_path / "pid2").read_text())) == replacement
    assert "launch_template_died" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("effect", "problem"),
    [
        ("thread", "2 Python threads are running"),
        ("exit", "exited with code 3 before it was ready"),
    ],
)
async def test_a_template_that_cannot_fork_safely_makes_the_pipeline_spawn_its_workers(
    ipc_base: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], effect: str, problem: str
) -> None:
    monkeypatch.setenv("OT_TEST_TEMPLATE_IMPORT", effect)
    with trio.fail_after(60):
        async with ot.open_pipeline(noisy_pipeline(ipc_base)) as pipeline:
            assert not helpers.template_processes()
            workers = helpers.worker_processes()
            assert len(workers) == 2 and all(_ppid(pid) == os.getpid() for pid in workers)
            assert (await pipeline.submit("r0", "x"))["pid"] in workers
    err = capfd.readouterr().err
    assert "launch_template_unusable" in err and problem in err, err


async def test_a_template_stuck_in_its_imports_fails_the_start_up_clearly(
    ipc_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OT_TEST_TEMPLATE_IMPORT", "hang")
    with trio.fail_after(60), pytest.raises(ot.StageStartupError, match=r"did not finish importing .* within 2 s"):
        async with ot.open_pipeline(noisy_pipeline(ipc_base), start_timeout=2):
            pass
    assert not helpers.template_processes()  # killed: it could not even read that it should exit


async def test_spawn_start_method_starts_a_fresh_interpreter_per_worker(ipc_base: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(noisy_pipeline(ipc_base, start_method="spawn")) as pipeline:
            assert not helpers.template_processes()
            workers = helpers.worker_processes()
            assert len(workers) == 2 and all(_ppid(pid) == os.getpid() for pid in workers)
            assert (await pipeline.submit("r0", "x"))["pid"] in workers


def test_start_method_is_validated(ipc_base: Path) -> None:
    with pytest.raises(ot.ConfigError, match=r"start_method: expected 'template' .* or 'spawn' .*, got 'fork'"):
        noisy_pipeline(ipc_base, start_method="fork")
