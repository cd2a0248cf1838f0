"""Admission: ``max_in_flight`` refuses requests beyond it at once, before any stage sees them."""

from __future__ import annotations

import pytest
import trio

import omni_trio as ot
from tests.core.test_abort import wait_until
from tests.placement import build, stage


def limited(placement: str, limit: int) -> ot.PipelineConfig:
    return build(
        placement,
        stage("slow", "create_block_until_aborted", next="tail"),
        stage("tail", "create_append", factory={"tag": "tail"}, terminal=True),
        max_in_flight=limit,
    )


async def test_requests_beyond_the_limit_are_refused_at_once(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(limited(placement, 2)) as pipeline:
            aborted: list[str] = []

            async def submit_until_aborted(rid: str) -> None:
                with pytest.raises(ot.RequestAborted):
                    await pipeline.submit(rid, "go")
                aborted.append(rid)

            async with trio.open_nursery() as nursery:
                for rid in ("r0", "r1"):
                    nursery.start_soon(submit_until_aborted, rid)

                async def both_computing() -> bool:
                    return (await pipeline.stats()).stages["slow"].active_requests == 2

                await wait_until(both_computing)
                with pytest.raises(ot.QueueFullError, match=r"max_in_flight=2"):
                    await pipeline.submit("r2", "go")
                with pytest.raises(ot.QueueFullError):
                    async with pipeline.stream("r3", "go"):
                        pass
                stats = await pipeline.stats()
                assert stats.rejected_requests == 2
                assert stats.live_requests == 2
                # The refused requests never reached a stage.
                assert stats.stages["slow"].active_requests == 2
                for rid in ("r0", "r1"):
                    assert await pipeline.abort(rid) is True
            assert sorted(aborted) == ["r0", "r1"]
            # A slot frees once a request resolves; an unblocked request goes through.
            assert await pipeline.submit("r2", "go", params={"block": False}) == {"trail": ["slow", "tail"]}
            assert (await pipeline.stats()).idle


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_the_limit_must_be_a_positive_whole_number(bad: object) -> None:
    with pytest.raises(ot.ConfigError, match=r"max_in_flight: expected a whole number >= 1"):
        limited("embedded", bad)  # type: ignore[arg-type]
