"""The handle ``open_pipeline`` yields is an ``ot.Pipeline``: the caller's methods work through it, in
every placement, and the deprecated ``live_request_ids`` still answers."""

from __future__ import annotations

import pytest
import trio

import omni_trio as ot
from tests.core.test_abort import wait_until
from tests.placement import build, stage


async def test_open_pipeline_yields_a_pipeline_that_serves_the_caller(placement: str) -> None:
    config = build(
        placement,
        stage("slow", "create_block_until_aborted", next="tail"),
        stage("tail", "create_append", factory={"tag": "tail"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            assert type(pipeline) is ot.Pipeline
            assert pipeline.health().ok
            async with trio.open_nursery() as nursery:

                async def held() -> None:
                    with pytest.raises(ot.RequestAborted):
                        await pipeline.submit("r0", "go")

                nursery.start_soon(held)

                async def computing() -> bool:
                    return (await pipeline.stats()).stages["slow"].active_requests == 1

                await wait_until(computing)
                with pytest.warns(DeprecationWarning, match="live_request_ids"):
                    assert pipeline.live_request_ids() == {"r0"}
                assert await pipeline.abort("r0")
            assert not await pipeline.abort("r0")
            assert (await pipeline.stats()).live_requests == 0
