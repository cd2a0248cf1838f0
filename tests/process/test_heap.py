"""A worker's start-up heap leaves its full garbage collections (omni_trio/runtime/heap.py).

Real worker processes, forked from the template or spawned: what the worker imported and built before
it said it was ready is in the permanent generation, which no collection walks; what it makes while
serving is collected as usual.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.process import helpers


@pytest.mark.parametrize("start_method", ["template", "spawn"])
async def test_a_worker_freezes_what_start_up_made_and_collects_what_requests_make(
    ipc_base: Path, start_method: str
) -> None:
    config = helpers.config(
        ipc_base,
        ot.StageConfig(name="report", factory_path="tests.process.heap_stages.create_heap_report",
                       process="p_report", terminal=True),
        start_method=start_method,
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            report = await pipeline.submit("r0", "x")
    # torch and the runtime alone are well over 10,000 objects.
    assert report["frozen"] > 10_000, report
    assert report["collected"] == {"import": False, "start-up": False, "request": True}
