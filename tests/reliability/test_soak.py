"""Soak: 20,000 requests through a 2-stage pipeline in two worker processes, 64 in flight.

After a warm-up of the first 2,000 requests, a checkpoint records the caller's open file
descriptors, threads and RSS, the run's shared-memory segments, and each worker's open file
descriptors and RSS; at the end (after 18,000 more requests) none of them may have grown beyond
the stated bounds: fds and threads not at all, segments none, RSS by less than ``RSS_BOUND``.
Every result is checked. The stages are trivial (``create_append``) so that the soak measures the
runtime: control plane, coordinator bookkeeping, bounded id sets (10,000 ids) and the receive loops.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import trio

import omni_trio as ot
from tests.placement import stage
from tests.process import helpers
from tests.process.helpers import rss

TOTAL = 20_000
WARM_UP = 2_000
IN_FLIGHT = 64
MIB = 1 << 20
RSS_BOUND = 32 * MIB  # allowed RSS growth of each process between the checkpoint and the end


def fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def snapshot(workers: dict[str, int], prefix: str) -> dict[str, int]:
    figures = {
        "caller_fds": fds(),
        "caller_threads": threading.active_count(),
        "caller_rss": rss(os.getpid()),
        "shm_segments": sum(1 for name in helpers.shm_segments() if name.startswith(f"{prefix}-")),
    }
    for name, pid in workers.items():
        figures[f"{name}_fds"] = fds(pid)
        figures[f"{name}_rss"] = rss(pid)
    return figures


def describe(checkpoint: dict[str, int], end: dict[str, int]) -> str:
    parts = []
    for key in checkpoint:
        if key.endswith("rss"):
            parts.append(f"{key}_mib={checkpoint[key] / MIB:.1f}->{end[key] / MIB:.1f}")
        else:
            parts.append(f"{key}={checkpoint[key]}->{end[key]}")
    return " ".join(parts)


async def test_soak_20k_requests_without_growth(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("a", "create_append", factory={"tag": "a"}, process="p_a", next="b"),
        stage("b", "create_append", factory={"tag": "b"}, process="p_b", terminal=True),
    )
    done = 0
    next_index = 0

    with trio.fail_after(80):
        async with ot.open_pipeline(config) as pipeline:
            workers = {("p_a" if "p_a.spec" in cmd else "p_b"): pid for pid, cmd in helpers.worker_processes().items()}
            assert sorted(workers) == ["p_a", "p_b"]
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))

            async def client(limit: int) -> None:
                nonlocal done, next_index
                while next_index < limit:
                    rid = f"soak-{next_index}"
                    next_index += 1
                    assert await pipeline.submit(rid, rid) == {"trail": [rid, "a", "b"]}
                    done += 1

            started = time.monotonic()
            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(client, WARM_UP)
            warm_up_s = time.monotonic() - started
            assert (await pipeline.stats()).idle
            checkpoint = snapshot(workers, prefix)
            async with trio.open_nursery() as nursery:
                for _ in range(IN_FLIGHT):
                    nursery.start_soon(client, TOTAL)
            elapsed = time.monotonic() - started
            stats = await pipeline.stats()
            assert stats.idle, stats
            end = snapshot(workers, prefix)
            assert helpers.worker_processes().keys() == {*workers.values()}  # the same two workers throughout

    assert done == TOTAL
    rate = (TOTAL - WARM_UP) / (elapsed - warm_up_s)
    print(f"\nFIGURES soak: requests={TOTAL} in_flight={IN_FLIGHT} processes=2 elapsed_s={elapsed:.2f} "
          f"rate_per_s={rate:.0f} rss_bound_mib={RSS_BOUND // MIB} {describe(checkpoint, end)}")
    for key in checkpoint:
        if key.endswith("rss"):
            assert end[key] - checkpoint[key] < RSS_BOUND, describe(checkpoint, end)
        else:
            assert end[key] <= checkpoint[key], describe(checkpoint, end)
    assert end["shm_segments"] == 0
