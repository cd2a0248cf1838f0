"""What no abort message covers: a stage holding a request the coordinator has resolved, and a
stream that its reader dropped without closing it.

- A branch whose result the request does not wait for (``terminal_stages_fn`` names ``c`` only, so
  the request resolves when ``c`` completes) keeps computing in ``b``: the safety net (each worker
  that got work reports, a while later, what its stages hold) aborts what the coordinator no longer
  knows. Before it, ``b`` held the request until the pipeline closed.
- ``async for ev in pipeline.stream(...)`` left with ``break`` (no ``async with``) aborts the request
  once the stream object is collected. Before, the request stayed live in the coordinator and in the
  stage for good.
"""

from __future__ import annotations

import gc
from pathlib import Path

import trio
import trio.testing

import omni_trio as ot
from omni_trio.control.audit import REPORT_INTERVAL_S
from tests.placement import stage
from tests.process import helpers


async def test_a_stage_forgets_a_request_the_coordinator_resolved(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("a", "create_append", factory={"tag": "a"}, process="pa", next=["b", "c"]),
        stage("b", "create_block_until_aborted", process="pb", terminal=True),
        stage("c", "create_append", factory={"tag": "c"}, process="pc", terminal=True),
        entry_stage="a",
        terminal_stages_fn="tests.reliability.abort_stages.only_c",
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            assert await pipeline.submit("r0", "x") == {"trail": ["x", "a", "c"]}
            assert (await pipeline.stats()).live_requests == 0
            # b gets r0 (maybe only after c completed it) and computes on for nobody: its scheduler
            # blocks until the request is aborted ...
            await helpers.wait_stats(pipeline, 10, lambda stats: stats.stages["b"].active_requests == 1)
            # ... until b's process reports what it holds, and the coordinator aborts what it resolved.
            started = trio.current_time()
            stats = await helpers.wait_stats(pipeline, REPORT_INTERVAL_S + 8, lambda stats: stats.idle)
            forgotten_after = trio.current_time() - started
            assert all(counters.healthy for counters in stats.stages.values())
            assert await pipeline.submit("r1", "y") == {"trail": ["y", "a", "c"]}
    print(f"\nFIGURES safety_net: stale_request_forgotten_after_s={forgotten_after:.2f} interval_s={REPORT_INTERVAL_S}")


async def test_breaking_out_of_a_bare_async_for_aborts_the_request(ipc_base: Path) -> None:
    config = helpers.config(ipc_base, stage("s", "create_stream_then_wait", process="ps", terminal=True))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            async for event in pipeline.stream("r0", "x"):
                assert isinstance(event, ot.StreamMessage) and event.chunk == "first"
                break  # the stage holds r0 until it is aborted; nothing calls aclose
            gc.collect()  # CPython collected the stream at the break already; other interpreters may not
            await trio.testing.wait_all_tasks_blocked()
            # Resolved already; abort() waits for the running abort to be confirmed, then says False.
            assert await pipeline.abort("r0") is False
            stats = await pipeline.stats()
            assert stats.idle, stats
            # The pipeline serves on (a stage refuses a retired id: a fresh one).
            async with pipeline.stream("r1", "x") as events:
                async for event in events:
                    assert event.chunk == "first"
                    break
            assert (await pipeline.stats()).idle
