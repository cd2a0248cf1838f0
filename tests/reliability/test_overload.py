"""10x overload: a slow stage, a burst far beyond its capacity, ``max_in_flight`` as the admission limit.

``a -> b -> c`` in three worker processes; ``b`` serves about 100 requests a second (10 ms each, one
at a time). The burst offers 1,000 requests a second for 2 s, each with a 3 s deadline, against
``max_in_flight=50``. Proven:

- memory stays bounded: never more than ``max_in_flight`` requests live (sampled through the burst),
  ``b``'s inbox never holds more, and the resident memory of every process grows by little;
- every request gets an answer: its result, ``QueueFullError`` at once, or ``RequestTimeout``;
- latency recovers: right after the burst the pipeline is idle and a request takes about what it
  took before the burst.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from tests.process import helpers

S = "tests.reliability.abort_stages"
MAX_IN_FLIGHT = 50
B_SECONDS = 0.010
OFFERED_PER_S = 1000
BURST_S = 2.0
DEADLINE_S = 3.0


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"no VmRSS for pid {pid}")


def rss_all() -> dict[str, float]:
    """Resident memory of this process and of each worker."""
    found = {"main": rss_mib(os.getpid())}
    found.update({f"worker {pid}": rss_mib(pid) for pid in helpers.worker_processes()})
    return found


async def latencies(pipeline: ot.Pipeline, prefix: str, n: int) -> list[float]:
    """``n`` requests one after the other; each one's latency in seconds."""
    taken = []
    for i in range(n):
        start = time.monotonic()
        assert await pipeline.submit(f"{prefix}{i}", "x") == {"trail": ["a", "b", "c"]}
        taken.append(time.monotonic() - start)
    return taken


async def test_ten_times_overload_stays_bounded_answers_everyone_and_recovers(ipc_base: Path) -> None:
    def counted(name: str, process: str, factory: dict[str, Any], **edges: Any) -> ot.StageConfig:
        return ot.StageConfig(name=name, factory_path=f"{S}.create_counted", process=process,
                              factory={"tag": name, "log_path": str(ipc_base / f"{name}.log"), **factory}, **edges)

    config = helpers.config(
        ipc_base,
        counted("a", "pa", {}, next="b"),
        counted("b", "pb", {"sleep_s": B_SECONDS}, next="c"),
        counted("c", "pc", {}, terminal=True),
        entry_stage="a",
        max_in_flight=MAX_IN_FLIGHT,
    )
    outcomes: dict[str, str] = {}
    peak = {"live": 0, "b_inbox": 0}
    burst_done = trio.Event()

    async def one(rid: str) -> None:
        try:
            await pipeline.submit(rid, "x", deadline=DEADLINE_S)
        except ot.QueueFullError:
            outcomes[rid] = "queue_full"
        except ot.RequestTimeout:
            outcomes[rid] = "timeout"
        else:
            outcomes[rid] = "result"

    async def sample() -> None:
        while not burst_done.is_set():
            stats = await pipeline.stats()
            peak["live"] = max(peak["live"], stats.live_requests)
            peak["b_inbox"] = max(peak["b_inbox"], stats.stages["b"].queued_inbox)
            await trio.sleep(0.1)

    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            before = await latencies(pipeline, "warm", 20)
            memory_before = rss_all()
            n = int(OFFERED_PER_S * BURST_S)
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample)
                async with trio.open_nursery() as burst:
                    for i in range(n):
                        await trio.sleep_until(started + i / OFFERED_PER_S)
                        burst.start_soon(one, f"burst{i}")
                burst_done.set()
            burst_s = trio.current_time() - started
            memory_after = rss_all()
            stats = await pipeline.stats()
            assert stats.idle, stats
            after = await latencies(pipeline, "after", 20)

    counts = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ("result", "queue_full", "timeout")}
    assert len(outcomes) == n and sum(counts.values()) == n  # everyone got one of the three answers
    assert counts["queue_full"] > n // 2, counts  # 10x overload: most are refused at once
    assert counts["result"] > 0, counts
    assert peak["live"] <= MAX_IN_FLIGHT and peak["b_inbox"] <= MAX_IN_FLIGHT, peak
    growth = {name: memory_after[name] - memory_before[name] for name in memory_before}
    assert all(grown < 64 for grown in growth.values()), growth
    p50_before, p50_after = statistics.median(before), statistics.median(after)
    assert p50_after < 2 * p50_before + 0.02, (p50_before, p50_after)
    print(f"\nFIGURES overload: offered_per_s={OFFERED_PER_S} capacity_per_s={1 / B_SECONDS:.0f} burst_s={BURST_S} "
          f"requests={n} answered={len(outcomes)} results={counts['result']} queue_full={counts['queue_full']} "
          f"timeouts={counts['timeout']} burst_wall_s={burst_s:.2f} peak_live={peak['live']} "
          f"peak_b_inbox={peak['b_inbox']} rss_growth_mib={ {k: round(v, 1) for k, v in growth.items()} } "
          f"p50_ms_before={p50_before * 1000:.1f} p50_ms_after={p50_after * 1000:.1f} "
          f"max_ms_after={max(after) * 1000:.1f}")

