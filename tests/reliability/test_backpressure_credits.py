"""Credits held until the consumer's scheduler takes a chunk: what must still hold around them.

A shared-memory chunk to a stage whose inbox is an ``Inbox`` holds its sender's credit until the
scheduler takes it (docs/design.md, "Credits"). These tests pin the cases where holding could
go wrong: a consumer that keeps every chunk it received (the pool runs dry: the stream must go on
through one-shot segments, not stall), an abort while the consumer stalls with chunks queued (the
credits come back, so the next stream on the same edge flows), and nothing left behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers

MIB = 1 << 20


def stream_config(base: Path, consumer_kwargs: dict[str, object], **comm: int) -> ot.PipelineConfig:
    return helpers.config(
        base,
        stage("producer", "create_lazy_producer", factory={"chunks": 32, "numel": MIB // 4, "max_queued": 2},
              process="p_prod", next="consumer", stream_to=["consumer"], comm=ot.CommConfig(**comm) if comm else None),
        stage("consumer", "create_slow_checksum", factory=consumer_kwargs, process="p_cons", terminal=True,
              can_accept_stream_before_payload=True),
    )


def check(result: dict[str, object], chunks: int) -> None:
    assert result["misplaced"] is None and result["chunks"] == chunks, result
    assert result["checksum"] == float(MIB // 4) * chunks * (chunks - 1) / 2, result


async def test_a_consumer_that_keeps_every_chunk_does_not_stall_the_stream(ipc_base: Path) -> None:
    # 32 chunks of 1 MiB kept to the end, a 4 MiB pool: the held slots run out after 4 chunks and the
    # rest travels in one-shot segments; credits come back as the scheduler takes each chunk.
    config = stream_config(ipc_base, {"sleep_s": 0.0, "keep": True}, pool_mb=4, credits=1)
    with helpers.nothing_left_behind(ipc_base), trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            for rid in ("keep-1", "keep-2"):
                result = await pipeline.submit(rid, "x")
                check(result, 32)
                assert result["kept_sum"] == result["checksum"]
            assert (await pipeline.stats()).idle


async def test_an_abort_while_the_consumer_stalls_returns_the_held_credits(ipc_base: Path) -> None:
    config = stream_config(ipc_base, {"sleep_s": 0.0, "first_sleep_s": 1.5})
    with helpers.nothing_left_behind(ipc_base), trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            async with trio.open_nursery() as nursery:

                async def doomed() -> None:
                    with pytest.raises(ot.RequestAborted):
                        await pipeline.submit("doomed", "x")

                nursery.start_soon(doomed)
                # The consumer stalls on chunk 0; chunks 1-2 wait in its inbox, holding the edge's 2 credits.
                await helpers.wait_stats(
                    pipeline, 10,
                    lambda s: s.stages["consumer"].queued_inbox >= 2,
                )
                await pipeline.abort("doomed")
            # Every credit of the edge came back: a second stream through it completes (the consumer
            # stalls 1.5 s on its first chunk again).
            check(await pipeline.submit("after", "x"), 32)
            await helpers.wait_stats(pipeline, 5, lambda s: s.idle)
