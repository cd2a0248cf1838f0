"""A scheduler thread stuck in user code for a request nobody waits for any more (its deadline
expired) is reported: ``stats()`` lists the stuck compute (stage, request, how long), the stage is
neither idle nor healthy, a later request is visibly queued behind it, the stage logs it once, and
the shutdown's wait for the thread is bounded (``STOP_GRACE_S``) and names the stage and request."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.stage.abandoned import STUCK_AFTER_S
from omni_trio.stage.lifecycle import STOP_GRACE_S
from tests.core.test_abort import autojump
from tests.process import helpers
from tests.reliability.failure_stages import M
from tests.stages import gate


async def test_a_compute_stuck_on_a_timed_out_request_is_reported_and_bounds_shutdown(
    ipc_base: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = helpers.config(
        ipc_base,
        ot.StageConfig(name="stuck", factory_path=f"{M}.create_stuck", process="p_stuck", terminal=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            with pytest.raises(ot.RequestTimeout):
                await pipeline.submit("r0", "x", params={"stuck_s": 60}, deadline=0.2)
            # A later request without a deadline queues behind the stuck compute.
            async def later() -> None:
                with pytest.raises(ot.RequestAborted):
                    await pipeline.submit("r1", "y")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(later)
                await trio.sleep(STUCK_AFTER_S + 0.3)
                stats = await pipeline.stats()
                stage = stats.stages["stuck"]
                assert set(stage.stuck) == {"r0"}, stage
                assert stage.stuck["r0"] >= STUCK_AFTER_S, stage
                assert not stage.healthy and not stage.idle and not stats.idle, stage
                assert stats.stuck == {"stuck": stage.stuck}
                assert stage.active_requests == 1 and stage.queued_inbox == 1, stage
                assert await pipeline.abort("r1")
            stats = await pipeline.stats()
            assert set(stats.stages["stuck"].stuck) == {"r0"} and not stats.idle
            closing = time.monotonic()
    closed_in = time.monotonic() - closing
    # Bounded by the stage's wait for its thread (plus the worker's own exit), far below the 60 s compute.
    assert closed_in < STOP_GRACE_S + 4, closed_in
    err = capfd.readouterr().err
    assert "compute_stuck_after_abort" in err and "request_id=r0" in err and "stage=stuck" in err, err
    (line,) = [line for line in err.splitlines() if "scheduler_thread_still_running" in line]
    assert "stage=stuck" in line and "'r0'" in line, line
    print(f"\nFIGURES stuck_compute: closed_in_s={closed_in:.2f} stop_grace_s={STOP_GRACE_S}")


async def test_the_stuck_window_in_virtual_time(mock_clock: trio.testing.MockClock) -> None:
    """Embedded, on trio's clock: the compute is not stuck before ``STUCK_AFTER_S``, stuck after it,
    and forgotten once it ends (the gate of ``tests.stages.create_gated`` ignores aborts)."""
    config = ot.PipelineConfig(stages=[ot.StageConfig(name="gated", factory_path="tests.stages.create_gated",
                                                      factory={"name": "stuck-window"}, terminal=True)])
    started, release = gate("stuck-window")
    started.clear()
    release.clear()
    try:
        async with ot.open_pipeline(config) as pipeline:
            with autojump(mock_clock), trio.fail_after(300):
                with pytest.raises(ot.RequestTimeout):
                    await pipeline.submit("r0", "x", deadline=10)
                assert started.is_set()
                stage = (await pipeline.stats()).stages["gated"]
                assert stage.stuck == {} and stage.healthy and stage.idle, stage  # just dropped: not stuck yet
                await trio.sleep(STUCK_AFTER_S)
                stage = (await pipeline.stats()).stages["gated"]
                assert set(stage.stuck) == {"r0"} and not stage.healthy and not stage.idle, stage
                release.set()
                # The serial scheduler runs r1 once r0's compute has returned.
                assert await pipeline.submit("r1", "y") == {"trail": ["y", "stuck-window"]}
                assert (await pipeline.stats()).idle
    finally:
        release.set()


@pytest.mark.parametrize("make", [ot.SimpleScheduler, ot.StreamingSimpleScheduler, ot.ThreadedSimpleScheduler])
def test_every_built_in_scheduler_reports_its_running_computes(make: Any) -> None:
    """``running_computes()``: the request whose compute runs now, with when it started; empty after."""
    entered, release = threading.Event(), threading.Event()

    def compute(payload: ot.StagePayload) -> ot.StagePayload:
        entered.set()
        release.wait(10)
        return payload

    scheduler = make(compute)
    serving = threading.Thread(target=scheduler.start, daemon=True)
    serving.start()
    try:
        payload = ot.StagePayload("r0", ot.OmniRequest("x"), {"raw_inputs": "x"})
        before = time.monotonic()
        scheduler.inbox.put(ot.IncomingMessage("r0", "new_request", payload))
        assert entered.wait(10)
        running = scheduler.running_computes()
        assert list(running) == ["r0"] and before <= running["r0"] <= time.monotonic(), running
        release.set()
        assert scheduler.outbox.get(timeout=10).type == "result"
        scheduler.stop()
        serving.join(10)  # the serving thread is done: whatever it ran has finished
        assert scheduler.running_computes() == {}
    finally:
        release.set()
        scheduler.stop()
        serving.join(10)
