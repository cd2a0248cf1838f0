"""``stats()`` under load and when a process cannot answer.

* A worker whose trio tasks are never all blocked (a request looping through an inline stage, so
  every hop schedules the next at once) still answers ``stats()`` promptly, with counters that agree.
* A worker that does not answer (stopped with SIGSTOP) makes ``stats()`` raise ``ot.StatsTimeout``
  naming it, an ``OmniTrioError``, not trio's bare ``TooSlowError``.
* A process being restarted reports its stages as restarting, never as idle.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers
from tests.process.helpers import submit_and_kill
from tests.reliability.failure_stages import M
from tests.reliability.test_restart import pipeline_config


def loop_config(base: Path) -> ot.PipelineConfig:
    """``loop`` (inline, routes to itself forever) in ``p_loop``, and the terminal ``end`` in ``p_other``."""
    return helpers.config(
        base,
        ot.StageConfig(name="loop", factory_path=f"{M}.create_loop", process="p_loop", next=["loop", "end"],
                       route_fn=f"{M}.route_loop"),
        stage("end", "create_passthrough", process="p_other", terminal=True),
        entry_stage="loop",
    )


def pid_of(process: str) -> int:
    """The pid of the worker process running ``process``."""
    (pid,) = [pid for pid, cmd in helpers.worker_processes().items() if cmd.endswith(f"/{process}.spec")]
    return pid


async def test_stats_answer_promptly_while_a_worker_is_never_idle(ipc_base: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(loop_config(ipc_base)) as pipeline, trio.open_nursery() as nursery:

            async def looping() -> None:
                with pytest.raises(ot.RequestAborted):
                    await pipeline.submit("spin", "x")

            nursery.start_soon(looping)
            await helpers.wait_stats(pipeline, 10, lambda s: s.stages["loop"].active_requests > 0)
            answers = []
            for _ in range(5):
                started = time.monotonic()
                stats = await pipeline.stats(timeout=2)
                answers.append(time.monotonic() - started)
                loop = stats.stages["loop"]
                # One request, held by the looping stage (or on its way back to it) and nowhere else: the
                # counters, read in one go, agree with that.
                assert stats.live_requests == 1, stats
                assert 1 <= loop.active_requests + loop.request_scopes + loop.in_flight_sends <= 3, loop
                assert stats.stages["end"].idle, stats
                assert not stats.idle
            assert max(answers) < 1.0, answers
            assert await pipeline.abort("spin")
            assert (await pipeline.stats()).idle
    print(f"\nFIGURES stats_under_traffic: answers_ms={[round(a * 1000) for a in answers]}")


async def test_a_process_that_does_not_answer_is_named(ipc_base: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(loop_config(ipc_base)) as pipeline:
            assert (await pipeline.stats()).idle
            stopped = pid_of("p_other")
            os.kill(stopped, signal.SIGSTOP)
            try:
                with pytest.raises(ot.StatsTimeout) as silent:
                    await pipeline.stats(timeout=0.5)
            finally:
                os.kill(stopped, signal.SIGCONT)
            assert isinstance(silent.value, ot.OmniTrioError)
            assert silent.value.processes == ["p_other"], silent.value
            assert "'p_other'" in str(silent.value) and "0.5 s" in str(silent.value)
            assert (await pipeline.stats()).idle  # answers again once it runs


async def test_a_restarting_process_reports_restarting_not_idle(ipc_base: Path, tmp_path: Path) -> None:
    # A worker forked from the template is ready a few ms after the backoff: the backoff keeps the
    # restart going through the stats and health calls below (as in test_restart).
    with trio.fail_after(60):
        async with ot.open_pipeline(pipeline_config(ipc_base, restart_backoff_s=2.0)) as pipeline:
            await submit_and_kill(pipeline, "r0", tmp_path / "pid0")
            stats = await pipeline.stats()
            blocker = stats.stages["blocker"]
            assert blocker.restarting and not blocker.idle and not blocker.healthy, blocker
            assert not stats.idle
            assert not stats.stages["first"].restarting and stats.stages["first"].idle
            assert pipeline.health().processes["p_block"] == "restarting"
            params = {"pid_file": str(tmp_path / "pid1"), "block": False}
            assert await pipeline.submit("r1", "y", params=params) == {"trail": ["blocked"]}
            stats = await pipeline.stats()
            assert not stats.stages["blocker"].restarting and stats.idle, stats
