"""Where a W5 request's time goes, measured whole: wall time and each process's CPU per request.

Run: ``python -m benchmarks.w5_cpu [--requests N] [--chunks C]`` (from the repository root, in the test
venv). Starts the bench's W5 pipeline (a talker streaming ``C`` small int64 chunks to a forwarding
vocoder in another process, which forwards them to the caller), streams 3 warm-up requests, then ``N``
sequential ones, and prints the wall time per request next to the CPU time per request of the caller
and of each worker (utime + stime from ``/proc/<pid>/stat``, all threads and the kernel's work for it),
and the time to each request's first chunk (p10 / p50 / p90).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import trio

import omni_trio as ot
from benchmarks.measure import descendant_pids, proc_cpu_ticks
from benchmarks.stages import stream_config


async def measure(requests: int, chunks: int) -> None:
    """Print wall and per-process CPU milliseconds per request of ``requests`` sequential W5 requests."""

    firsts: list[float] = []

    async def one(pipeline: ot.Pipeline, request_id: str) -> float:
        """Stream one request; the milliseconds to its first chunk."""
        start = time.perf_counter()
        first = 0.0
        async with pipeline.stream(request_id, "x", params={"chunks": chunks}) as events:
            async for _ in events:
                first = first or (time.perf_counter() - start) * 1e3
        return first

    with trio.fail_after(120 + requests * chunks / 1000):
        async with ot.open_pipeline(stream_config(chunks)) as pipeline:
            for i in range(3):
                await one(pipeline, f"warm-{i}")
            pids = [os.getpid(), *descendant_pids(os.getpid())]
            before = {pid: proc_cpu_ticks(pid) for pid in pids}
            start = time.perf_counter()
            for i in range(requests):
                firsts.append(await one(pipeline, f"r{i}"))
            wall = time.perf_counter() - start
            after = {pid: proc_cpu_ticks(pid) for pid in pids}
    tick = os.sysconf("SC_CLK_TCK")
    per_request = {pid: (after[pid] - before[pid]) / tick / requests * 1e3 for pid in pids}
    busy = [round(ms, 1) for ms in per_request.values() if ms > 0]  # the template process does nothing
    tenths = statistics.quantiles(firsts, n=10) if len(firsts) > 1 else firsts * 9
    print(
        f"wall {wall / requests * 1e3:.1f} ms per request of {chunks} chunks; CPU per request "
        f"(caller, workers) {busy} ms, together {sum(per_request.values()):.1f} ms; first chunk "
        f"p10 {tenths[0]:.2f} / p50 {statistics.median(firsts):.2f} / p90 {tenths[-1]:.2f} ms"
    )


def main() -> None:
    """Parse the arguments and run one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--chunks", type=int, default=1000)
    args = parser.parse_args()
    trio.run(measure, args.requests, args.chunks)


if __name__ == "__main__":
    main()
