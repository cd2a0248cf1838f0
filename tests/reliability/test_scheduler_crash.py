"""A scheduler whose serving loop dies: its in-flight request fails naming the crash, later requests
fail fast because the stage is unhealthy, stats say so, and the pipeline still closes promptly."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.placement import build, stage


@pytest.mark.parametrize("placement", ["embedded", "processes"])
async def test_crashed_scheduler_fails_requests_and_marks_the_stage_unhealthy(
    placement: str, ipc_base: Path
) -> None:
    config = build(
        placement,
        stage("first", "create_append", factory={"tag": "first"}, next="crashy"),
        stage("crashy", "create_scheduler_crash", terminal=True),
        endpoints=ot.EndpointsConfig(base_path=str(ipc_base)),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            with pytest.raises(ot.RequestFailed) as crashed:
                await pipeline.submit("r0", "x")
            assert crashed.value.stage == "crashy"
            assert "scheduler crashed" in crashed.value.error
            assert "RuntimeError" in crashed.value.error and "'r0'" in crashed.value.error

            with trio.fail_after(5), pytest.raises(ot.RequestFailed) as refused:
                await pipeline.submit("r1", "y")
            assert refused.value.stage == "crashy"
            assert "stage is unhealthy" in refused.value.error
            assert "scheduler crashed" in refused.value.error

            stats = await pipeline.stats()
            assert stats.stages["crashy"].healthy is False
            assert stats.stages["first"].healthy is True
            assert stats.idle, stats
        # Leaving the block closed the pipeline within the bound above: nothing waited on the dead thread.
