"""Abort storms: hundreds of concurrent requests across worker processes, a random half aborted at
random times. Every request that was not aborted returns exactly the right result, every aborted one
ends as RequestAborted (or completed first, and then ``abort`` said so by returning False), the
pipeline ends idle, and nothing is left behind (checked by the autouse ``ipc_base`` fixture: no IPC
directory, no shared-memory segment of the run, no worker process).

Sizes: 300 requests through a 4-process fan-out/fan-in pipeline, 150 of them aborted after 0-50 ms;
60 streams of 20 shared-memory chunks (32 KiB each), 30 of them aborted mid-stream.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from omni_trio.comm.segments import is_pooled_slot
from tests.placement import place, stage
from tests.process import helpers

M = "examples.ch4_fanin_stages"

N_REQUESTS = 300
N_STREAMS = 60
CHUNKS = 20
CHUNK_NUMEL = 8192  # float32: 32 KiB per chunk, over the 16 KiB inline limit, so every chunk goes by shm


async def settle_idle(pipeline: ot.Pipeline, within_s: float = 2.0) -> int:
    """Wait until ``stats()`` is idle (at most ``within_s``); return how many polls were not idle.

    FINDING (docs/reliability.md, "stats race"): right after a storm of aborted shared-memory streams,
    ``stats()`` can report ``relay_buffers=1`` at the producer for a few milliseconds: the consumer
    process answered ``AbortDone`` before it had read (and ACKed) a chunk still queued on its socket.
    The counter always returns to zero; a strict xfail would flake, so the test bounds the settling
    time instead and prints the number of non-idle polls.
    """
    busy = 0
    with trio.fail_after(within_s):
        while not (stats := await pipeline.stats()).idle:
            busy += 1
            print(f"\nnot idle yet: {stats}")
            await trio.sleep(0.01)
    return busy


def fanin_config(base: Path) -> ot.PipelineConfig:
    """split -> (upper, count) -> join, each stage in a worker process of its own."""
    stages = [
        ot.StageConfig(name="split", factory_path=f"{M}.create_split", next=["upper", "count"],
                       project_payload={"upper": f"{M}.project_to_upper", "count": f"{M}.project_to_count"}),
        ot.StageConfig(name="upper", factory_path=f"{M}.create_upper", next="join"),
        ot.StageConfig(name="count", factory_path=f"{M}.create_count", next="join"),
        ot.StageConfig(name="join", factory_path=f"{M}.create_join", wait_for=["upper", "count"],
                       merge_fn=f"{M}.merge", terminal=True),
    ]
    return helpers.config(base, *place(stages, "processes"), entry_stage="split")


def fanin_expected(text: str) -> dict[str, Any]:
    return {"sources": ["count", "upper"], "count": len(text.split()), "count_saw": ["words"],
            "upper": text.upper(), "upper_saw": ["text"]}


async def test_abort_storm_fan_out_fan_in(ipc_base: Path) -> None:
    rng = random.Random(20240611)
    words = ["omni", "trio", "stage", "worker", "abort", "storm", "fan", "in", "out"]
    texts = {f"r{i}": " ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for i in range(N_REQUESTS)}
    doomed = set(rng.sample(sorted(texts), N_REQUESTS // 2))
    delays = {rid: rng.uniform(0, 0.05) for rid in sorted(doomed)}
    outcomes: dict[str, Any] = {}
    abort_returned: dict[str, bool] = {}

    async def run_one(pipeline: ot.Pipeline, rid: str) -> None:
        try:
            outcomes[rid] = await pipeline.submit(rid, texts[rid])
        except ot.RequestAborted as exc:
            assert exc.request_id == rid
            outcomes[rid] = exc

    async def abort_later(pipeline: ot.Pipeline, rid: str) -> None:
        await trio.sleep(delays[rid])
        abort_returned[rid] = await pipeline.abort(rid)

    started = time.monotonic()
    with trio.fail_after(60):
        async with ot.open_pipeline(fanin_config(ipc_base)) as pipeline:
            assert len(helpers.worker_processes()) == 4
            async with trio.open_nursery() as nursery:
                for rid in texts:
                    nursery.start_soon(run_one, pipeline, rid)
                    if rid in doomed:
                        nursery.start_soon(abort_later, pipeline, rid)
            # Every caller has its answer, every abort was confirmed by every process: nothing is
            # held anywhere at once, without a settling window.
            stats = await pipeline.stats()
            assert stats.idle, stats
            # Idle and still open: no segment of the run is left by the aborted transfers.
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))
            # Pooled slots stay until the pipeline closes (the ipc_base fixture checks that).
            assert not [s for s in helpers.shm_segments() if s.startswith(f"{prefix}-") and not is_pooled_slot(s)]
            # Still serving correctly after the storm.
            assert await pipeline.submit("after", "still serving") == fanin_expected("still serving")
    elapsed = time.monotonic() - started

    assert sorted(outcomes) == sorted(texts)
    for rid, outcome in outcomes.items():
        if rid not in doomed:
            assert outcome == fanin_expected(texts[rid]), rid
        elif isinstance(outcome, ot.RequestAborted):
            assert abort_returned[rid] is True, rid
        else:  # it completed before the abort arrived
            assert outcome == fanin_expected(texts[rid]), rid
            assert abort_returned[rid] is False, rid
    aborted = sum(isinstance(o, ot.RequestAborted) for o in outcomes.values())
    assert aborted > 0, "no abort landed while its request was live: the storm tested nothing"
    assert helpers.worker_processes() == {}
    print(f"\nFIGURES storm_fanin: requests={N_REQUESTS} abort_calls={len(doomed)} aborted={aborted} "
          f"completed_before_abort={len(doomed) - aborted} correct_results={N_REQUESTS - aborted} "
          f"processes=4 elapsed_s={elapsed:.2f}")


async def test_abort_storm_mid_stream_over_shared_memory(ipc_base: Path) -> None:
    rng = random.Random(77)
    rids = [f"s{i}" for i in range(N_STREAMS)]
    abort_after = {rid: rng.randint(1, CHUNKS - 2) for rid in rng.sample(rids, N_STREAMS // 2)}
    outcomes: dict[str, Any] = {}
    chunk_counts: dict[str, int] = {}
    abort_returned: dict[str, bool] = {}
    config = helpers.config(
        ipc_base,
        *place([
            stage("producer", "create_producer", factory={"chunks": CHUNKS, "numel": CHUNK_NUMEL}, next="sum",
                  stream_to=["sum"]),
            stage("sum", "create_streaming_sum", terminal=True, can_accept_stream_before_payload=True),
        ], "processes"),
    )

    async def run_one(pipeline: ot.Pipeline, rid: str) -> None:
        sums: list[tuple[int, float]] = []
        results: list[Any] = []
        try:
            async with pipeline.stream(rid, "x") as events:
                async for ev in events:
                    if isinstance(ev, ot.StreamMessage):
                        sums.append((ev.chunk_id, ev.chunk))
                        if len(sums) == abort_after.get(rid):
                            abort_returned[rid] = await pipeline.abort(rid)
                    else:
                        results.append(ev.result)
        except ot.RequestAborted:
            outcomes[rid] = "aborted"
        else:
            outcomes[rid] = results
        chunk_counts[rid] = len(sums)
        # Whatever arrived, arrived complete and in order.
        assert sums == [(i, float(i * CHUNK_NUMEL)) for i in range(len(sums))], rid

    started = time.monotonic()
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            async with trio.open_nursery() as nursery:
                for rid in rids:
                    nursery.start_soon(run_one, pipeline, rid)
            busy_polls = await settle_idle(pipeline)
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))
            # Pooled slots stay until the pipeline closes (the ipc_base fixture checks that).
            assert not [s for s in helpers.shm_segments() if s.startswith(f"{prefix}-") and not is_pooled_slot(s)]
            assert await pipeline.submit("after", "x") == {"chunks": CHUNKS}
    elapsed = time.monotonic() - started

    for rid in rids:
        if rid in abort_after and abort_returned[rid]:
            assert outcomes[rid] == "aborted", rid
            # Chunks already queued for the caller before the abort are still yielded, then the error.
            assert abort_after[rid] <= chunk_counts[rid] <= CHUNKS, rid
        else:  # not aborted, or it had completed (all chunks queued for the caller) before the abort
            assert outcomes[rid] == [{"chunks": CHUNKS}], rid
            assert chunk_counts[rid] == CHUNKS, rid
    aborted = sum(outcome == "aborted" for outcome in outcomes.values())
    assert aborted > 0, "no abort landed while its stream was live: the storm tested nothing"
    extra = sum(chunk_counts[r] - n for r, n in abort_after.items() if abort_returned[r])
    sent_mb = N_STREAMS * CHUNKS * CHUNK_NUMEL * 4 / 2**20
    print(f"\nFIGURES storm_stream: streams={N_STREAMS} abort_calls={len(abort_after)} aborted_mid_stream={aborted} "
          f"chunks_per_stream={CHUNKS} chunk_kib={CHUNK_NUMEL * 4 // 1024} produced_mib={sent_mb:.1f} "
          f"chunks_received={sum(chunk_counts.values())} "
          f"queued_chunks_yielded_after_abort={extra} "
          f"stats_polls_not_idle={busy_polls} elapsed_s={elapsed:.2f}")
