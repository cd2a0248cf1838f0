"""A dead worker fails each live request with the right story, at once, and nothing waits for them.

``a`` (``p_a``) blocks each request until it is aborted; ``b`` (``p_b``) sleeps through its
requests, ignoring aborts. ``r1`` is held by ``a``, ``r2`` went on to ``b``; then ``p_b`` is
killed. ``r2`` was in the dead process: ``StageProcessDied`` "lost" (``held_by`` None). ``r1`` was
never there: it fails at once with ``held_by="p_a"``, and is aborted in ``p_a`` (so ``a``'s thread
lets it go: without a restart policy, the pipeline's exit does not wait ``STOP_GRACE_S`` for it; with
one, ``a`` is idle as soon as the caller hears of the failure).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.stage.lifecycle import STOP_GRACE_S
from tests.process import helpers
from tests.reliability.failure_stages import M


def death_config(base: Path, **b_options: Any) -> ot.PipelineConfig:
    return helpers.config(
        base,
        ot.StageConfig(name="a", factory_path=f"{M}.create_holder", process="p_a", next="b"),
        ot.StageConfig(name="b", factory_path=f"{M}.create_stuck", process="p_b", terminal=True, **b_options),
    )


async def kill_b_with_r1_in_a_and_r2_in_b(pipeline: ot.Pipeline, tmp_path: Path) -> dict[str, Any]:
    """Run r1 (held by a) and r2 (in b), SIGKILL p_b; return each request's error and when it came."""
    errors: dict[str, Any] = {}

    async def run(rid: str, params: dict[str, Any]) -> None:
        with pytest.raises(ot.StageProcessDied) as died:
            await pipeline.submit(rid, "x", params=params)
        errors[rid] = (died.value, time.monotonic())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "r1", {"pid_file": str(tmp_path / "a1")})
        await helpers.wait_for_file(tmp_path / "a1")
        nursery.start_soon(run, "r2", {"pid_file": str(tmp_path / "a2"), "block": False, "stuck_s": 60,
                                       "started_file": str(tmp_path / "b2")})
        b_pid = int(await helpers.wait_for_file(tmp_path / "b2"))
        os.kill(b_pid, signal.SIGKILL)
        errors["killed_at"] = time.monotonic()
    r1, r2 = errors["r1"][0], errors["r2"][0]
    assert (r1.request_id, r1.process, r1.held_by, r1.returncode) == ("r1", "p_b", "p_a", -signal.SIGKILL), r1
    assert "aborted in process 'p_a'" in str(r1) and "'p_b'" in str(r1), r1
    assert (r2.request_id, r2.process, r2.held_by) == ("r2", "p_b", None), r2
    assert "lost" in str(r2), r2
    latest = max(errors["r1"][1], errors["r2"][1]) - errors["killed_at"]
    assert latest < 1.0, latest  # "within a second" (DESIGN.md)
    errors["latest_s"] = latest
    return errors


async def test_requests_held_elsewhere_are_aborted_at_once_and_exit_does_not_wait(
    ipc_base: Path, tmp_path: Path
) -> None:
    with trio.fail_after(60), pytest.raises(ot.StageProcessDied) as ended:
        async with ot.open_pipeline(death_config(ipc_base)) as pipeline:
            errors = await kill_b_with_r1_in_a_and_r2_in_b(pipeline, tmp_path)
            await trio.sleep_forever()  # the death ends the pipeline
    exit_s = time.monotonic() - errors["killed_at"]
    assert ended.value.request_id == "" and ended.value.process == "p_b"
    # a's thread was released by the abort: nothing waits STOP_GRACE_S for it.
    assert exit_s < STOP_GRACE_S - 2, exit_s
    print(f"\nFIGURES death_no_restart: failed_within_s={errors['latest_s']:.3f} exit_after_kill_s={exit_s:.2f}")


async def test_with_a_restart_policy_the_same_requests_fail_and_the_pipeline_serves_on(
    ipc_base: Path, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(death_config(ipc_base, restart="on-failure")) as pipeline:
            errors = await kill_b_with_r1_in_a_and_r2_in_b(pipeline, tmp_path)
            stats = await pipeline.stats()
            assert stats.stages["a"].idle, stats  # r1 was aborted in p_a before its caller heard
            params = {"pid_file": str(tmp_path / "a3"), "block": False}
            assert await pipeline.submit("r3", "y", params=params) == {"trail": ["blocked", "stuck"]}
            assert (await pipeline.stats()).idle
    print(f"\nFIGURES death_restart: failed_within_s={errors['latest_s']:.3f}")
