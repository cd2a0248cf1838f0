"""The default rule in a pipeline: an ``async def`` compute runs on its stage's trio loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.core.test_abort import wait_until


def two_stages_in_one_process(process: str | None, *, threaded: bool = False) -> ot.PipelineConfig:
    """``sleeper`` (async, two at a time) then ``after`` (a plain function on its thread), one process."""
    return ot.PipelineConfig(stages=[
        ot.StageConfig(name="sleeper", factory_path="tests.stages.create_async_append", process=process,
                       factory={"tag": "sleeper", "max_concurrency": 2, "threaded": threaded}, next="after"),
        ot.StageConfig(name="after", factory_path="tests.stages.create_append", process=process,
                       factory={"tag": "after"}, terminal=True),
    ])


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("process", [None, "worker"])
async def test_a_sleeping_async_compute_blocks_nothing_and_an_abort_cancels_it(
    process: str | None, threaded: bool, tmp_path: Path
) -> None:
    marker = str(tmp_path / "slow")
    with trio.fail_after(60):
        async with ot.open_pipeline(two_stages_in_one_process(process, threaded=threaded)) as pipeline:
            outcome: list[BaseException] = []

            async def slow() -> None:
                try:
                    await pipeline.submit("slow", "x", params={"sleep": 3600, "marker": marker})
                except ot.RequestAborted as exc:
                    outcome.append(exc)

            async def started() -> bool:
                return os.path.exists(f"{marker}.started")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await wait_until(started)
                # While 'slow' awaits in sleeper, the loop serves the next request through both stages.
                assert await pipeline.submit("fast", "y") == {"trail": ["y", "sleeper", "after"]}
                assert await pipeline.abort("slow") is True
            assert len(outcome) == 1
            cancelled = Path(f"{marker}.cancelled")

            async def was_cancelled() -> bool:
                return cancelled.exists()

            # The abort is acknowledged when its process took it; the cancellation lands a tick later.
            await wait_until(was_cancelled)
            if process is None:
                # It ran on the caller's own loop thread (embedded stages share the caller's loop).
                import threading

                assert cancelled.read_text() == str(threading.get_ident())
            assert (await pipeline.stats()).idle


@pytest.mark.parametrize("process", [None, "worker"])
async def test_an_async_compute_error_fails_the_request_with_the_stage_name(process: str | None) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(two_stages_in_one_process(process)) as pipeline:
            with pytest.raises(ot.RequestFailed) as info:
                await pipeline.submit("bad", "poison")
            assert info.value.stage == "sleeper"
            assert info.value.error == "ValueError: async compute refused 'poison'"
            results = []
            async with trio.open_nursery() as nursery:

                async def one(i: int) -> None:
                    results.append(await pipeline.submit(f"r{i}", f"in{i}"))

                for i in range(5):
                    nursery.start_soon(one, i)
            assert sorted(r["trail"][0] for r in results) == [f"in{i}" for i in range(5)]
            assert (await pipeline.stats()).idle
