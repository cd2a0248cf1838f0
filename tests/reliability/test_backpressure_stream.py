"""Back-pressure on a stream between worker processes: a fast producer, a slow consumer, 1 GiB.

The first test streams 1,024 chunks of 1 MiB (float32) from a producer that makes each chunk only
when its outbox has room (``tests.stages.LazyProducer``, an ``Outbox(max_queued_streams=4)``) into a
consumer in another process that sleeps 1 ms per chunk and keeps only a running checksum. No chunk
is lost, duplicated or reordered (chunk ids and contents are checked one by one, plus a checksum),
and the resident memory of the caller, the producer's worker and the consumer's worker grows by less
than ``RSS_BOUND`` (during and after, sampled every 20 ms).

Two more tests push each end (they were strict xfails until the runtime bounded both, see
docs/reliability.md):
* a consumer that stalls with chunks queued: each shared-memory chunk holds its sender's credit until
  the consumer's scheduler has taken it from its ``Inbox``, so the stalled consumer's process holds at
  most ``comm.credits`` unprocessed chunks;
* a producer that puts chunks as fast as it makes them, into an ``Outbox(max_queued_streams=4)``:
  its ``put`` waits while four chunks are unsent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers
from tests.process.helpers import rss

MIB = 1 << 20


@pytest.fixture(autouse=True)
def malloc_returns_large_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers inherit the environment: with a fixed mmap threshold glibc maps every block of 128 KiB
    or more on its own and unmaps it when freed, so a worker's RSS follows the tensors it holds
    rather than the heap glibc keeps for reuse (its default threshold rises to 32 MiB after the first
    large free, and then a freed 4 MiB chunk stays resident)."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))
RSS_BOUND = 300 * MIB  # growth allowed to each process during and after the 1 GiB stream


def stream_config(base: Path, producer: str, producer_kwargs: dict[str, Any], consumer_kwargs: dict[str, Any]
                  ) -> ot.PipelineConfig:
    return helpers.config(
        base,
        stage("producer", producer, factory=producer_kwargs, process="p_prod", next="consumer",
              stream_to=["consumer"]),
        stage("consumer", "create_slow_checksum", factory=consumer_kwargs, process="p_cons", terminal=True,
              can_accept_stream_before_payload=True),
    )


class RssMonitor:
    """Samples the RSS of the caller and of each worker every 20 ms, from a baseline."""

    def __init__(self) -> None:
        workers = helpers.worker_processes()
        self.pids = {"caller": os.getpid()}
        for name in ("p_prod", "p_cons"):
            (pid,) = [pid for pid, cmd in workers.items() if f"{name}.spec" in cmd]
            self.pids[name] = pid
        self.base = {name: rss(pid) for name, pid in self.pids.items()}
        self.peak = dict(self.base)
        self.samples = 0

    def sample(self) -> None:
        self.samples += 1
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak[name], rss(pid))

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            self.sample()
            await trio.sleep(0.02)

    def growth(self) -> dict[str, int]:
        return {name: self.peak[name] - self.base[name] for name in self.pids}

    def describe(self, after: dict[str, int] | None = None) -> str:
        parts = []
        for name in self.pids:
            text = f"{name}: base={self.base[name] / MIB:.0f} peak={self.peak[name] / MIB:.0f}"
            if after is not None:
                text += f" after={after[name] / MIB:.0f}"
            parts.append(text + " MiB")
        return "; ".join(parts)


async def stream_and_watch(pipeline: ot.Pipeline, rid: str, params: dict[str, Any]) -> tuple[Any, RssMonitor]:
    # Warm up first (torch imported and the paths used in both workers) so the baseline is fair.
    await pipeline.submit(f"{rid}-warm-up", "x", params={"chunks": 4})
    monitor = RssMonitor()
    async with trio.open_nursery() as nursery:
        await nursery.start(monitor.run)
        result = await pipeline.submit(rid, "x", params=params)
        nursery.cancel_scope.cancel()
    monitor.sample()
    return result, monitor


async def test_one_gib_stream_into_a_slow_consumer_keeps_order_and_memory(ipc_base: Path) -> None:
    chunks, numel = 1024, MIB // 4  # 1,024 float32 chunks of 1 MiB: 1 GiB
    config = stream_config(ipc_base, "create_lazy_producer", {"chunks": chunks, "numel": numel, "max_queued": 4},
                           {"sleep_s": 0.001})
    started = time.monotonic()
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            t0 = time.monotonic()
            result, monitor = await stream_and_watch(pipeline, "big", {})
            stream_s = time.monotonic() - t0
            await helpers.wait_stats(pipeline, 5, lambda s: s.idle)  # everything the stream held is let go
            after = {name: rss(pid) for name, pid in monitor.pids.items()}
    assert result["misplaced"] is None, f"chunk out of place (expected, chunk_id, first, last): {result['misplaced']}"
    assert result["chunks"] == chunks
    assert result["bytes"] == chunks * numel * 4 == 1 << 30
    assert result["checksum"] == float(numel) * chunks * (chunks - 1) / 2  # sum over i of numel * i, exact in fp64
    growth = monitor.growth()
    print(f"\nFIGURES backpressure_1gib: chunks={chunks} chunk_mib=1 streamed_mib={result['bytes'] / MIB:.0f} "
          f"consumer_sleep_ms=1 stream_s={stream_s:.2f} rss_samples={monitor.samples} "
          f"growth_mib={ {k: round(v / MIB) for k, v in growth.items()} } bound_mib={RSS_BOUND // MIB} "
          f"[{monitor.describe(after)}] total_s={time.monotonic() - started:.2f}")
    for name, grown in growth.items():
        assert grown < RSS_BOUND, f"{name} grew by {grown / MIB:.0f} MiB during the stream: {monitor.describe(after)}"
        assert after[name] - monitor.base[name] < RSS_BOUND, monitor.describe(after)


async def test_a_stalled_consumer_throttles_the_transfer(ipc_base: Path) -> None:
    chunks, numel = 128, MIB  # 128 float32 chunks of 4 MiB: 512 MiB, all sent while the consumer stalls
    config = stream_config(ipc_base, "create_lazy_producer", {"chunks": chunks, "numel": numel, "max_queued": 2},
                           {"sleep_s": 0.0, "first_sleep_s": 2.0})
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            result, monitor = await stream_and_watch(pipeline, "stalled", {})
            assert (await pipeline.stats()).idle
    assert result["misplaced"] is None and result["chunks"] == chunks
    growth = monitor.growth()
    print(f"\nFIGURES backpressure_stalled_consumer: chunks={chunks} chunk_mib=4 stall_s=2.0 "
          f"growth_mib={ {k: round(v / MIB) for k, v in growth.items()} } bound_mib={RSS_BOUND // MIB}")
    assert growth["p_cons"] < RSS_BOUND, f"consumer grew by {growth['p_cons'] / MIB:.0f} MiB while stalled"


async def test_an_eager_producer_is_throttled(ipc_base: Path) -> None:
    chunks, numel = 512, MIB // 4  # 512 float32 chunks of 1 MiB: half the passing test's stream
    config = stream_config(ipc_base, "create_producer", {"chunks": chunks, "numel": numel, "max_queued_streams": 4},
                           {"sleep_s": 0.0})
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            result, monitor = await stream_and_watch(pipeline, "eager", {})
            assert (await pipeline.stats()).idle
    assert result["misplaced"] is None and result["chunks"] == chunks
    growth = monitor.growth()
    print(f"\nFIGURES backpressure_eager_producer: chunks={chunks} chunk_mib=1 "
          f"growth_mib={ {k: round(v / MIB) for k, v in growth.items()} } bound_mib={RSS_BOUND // MIB}")
    assert growth["p_prod"] < RSS_BOUND, f"producer grew by {growth['p_prod'] / MIB:.0f} MiB"
