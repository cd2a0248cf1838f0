"""An ``async def`` compute that awaits asyncio works in a pipeline (it runs on an asyncio loop of its
scheduler thread, as in SGLang-Omni); one that awaits trio runs on the stage's loop when it says so."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.payload import StagePayload
from tests.placement import build, process_for


def create_sleeper(on_trio: bool = False, threaded: bool = False) -> Any:
    async def on_asyncio(payload: StagePayload) -> StagePayload:
        await asyncio.sleep(0.01)
        payload.data = {"text": str(payload.request.inputs).upper(), "thread": threading.get_ident()}
        return payload

    async def on_trio_loop(payload: StagePayload) -> StagePayload:
        await trio.sleep(0.01)
        payload.data = {"text": str(payload.request.inputs).upper(), "thread": threading.get_ident()}
        return payload

    compute = on_trio_loop if on_trio else on_asyncio
    if threaded:
        return ot.ThreadedSimpleScheduler(compute, max_concurrency=2, run_on_trio_loop=on_trio)
    return ot.SimpleScheduler(compute, max_concurrency=2, run_on_trio_loop=on_trio)


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("on_trio", [False, True])
async def test_async_compute_awaits_its_own_library(placement: str, on_trio: bool, threaded: bool) -> None:
    config = build(
        placement,
        ot.StageConfig(
            name="sleeper",
            factory_path="tests.core.test_asyncio_compute.create_sleeper",
            factory={"on_trio": on_trio, "threaded": threaded},
            terminal=True,
        ),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            results: dict[str, Any] = {}

            async def one(word: str) -> None:
                results[word] = await pipeline.submit(word, word)

            async with trio.open_nursery() as nursery:
                for word in ("a", "b", "c"):
                    nursery.start_soon(one, word)
            assert (await pipeline.stats()).idle
    assert [results[word]["text"] for word in ("a", "b", "c")] == ["A", "B", "C"]
    on_callers_thread = {result["thread"] for result in results.values()} == {threading.get_ident()}
    # In the caller's process, the trio-loop compute runs on the caller's own loop thread; the asyncio one never does.
    assert on_callers_thread == (on_trio and process_for(0, "sleeper", placement) is None)
