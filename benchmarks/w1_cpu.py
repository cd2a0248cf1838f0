"""Where a W1 request's time goes, measured whole: wall time and each process's CPU per request.

Run: ``python -m benchmarks.w1_cpu [--inline] [--requests N]`` (from the repository root, in the test
venv). Starts the bench's W1 pipeline (two no-op stages, each in a worker process of its own), sends
200 warm-up requests, then ``N`` sequential ones, and prints the wall time per request next to the CPU
time per request of the caller and of each worker (utime + stime from ``/proc/<pid>/stat``: all of a
process's threads and the kernel's work for it included). ``--inline`` builds the
stages with ``inline=True`` (compute on the stage's loop, no scheduler thread). To see where a worker
spends it, run a long one and attach py-spy to a worker's pid (``py-spy record --gil -p PID``).
"""

from __future__ import annotations

import argparse
import os
import time

import attrs
import trio

import omni_trio as ot
from benchmarks.measure import descendant_pids, proc_cpu_ticks
from benchmarks.stages import chain_config


async def measure(inline: bool, requests: int) -> None:
    """Print wall and per-process CPU microseconds per request of ``requests`` sequential W1 requests."""
    config = chain_config(2)
    if inline:
        config = attrs.evolve(
            config, stages=[attrs.evolve(s, factory={**s.factory, "inline": True}) for s in config.stages]
        )
    with trio.fail_after(120 + requests / 100):
        async with ot.open_pipeline(config) as pipeline:
            for i in range(200):
                await pipeline.submit(f"warm-{i}", "x")
            pids = [os.getpid(), *descendant_pids(os.getpid())]
            before = {pid: proc_cpu_ticks(pid) for pid in pids}
            start = time.perf_counter()
            for i in range(requests):
                await pipeline.submit(f"r{i}", "x")
            wall = time.perf_counter() - start
            after = {pid: proc_cpu_ticks(pid) for pid in pids}
    tick = os.sysconf("SC_CLK_TCK")
    per_request = {pid: (after[pid] - before[pid]) / tick / requests * 1e6 for pid in pids}
    busy = [round(us) for us in per_request.values() if us > 0]  # the template process does nothing
    print(
        f"{'inline' if inline else 'default'}: wall {wall / requests * 1e6:.0f} us per request; CPU per request "
        f"(caller, workers) {busy} us, together {sum(per_request.values()):.0f} us"
    )


def main() -> None:
    """Parse the arguments and run one measurement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inline", action="store_true", help="stages with inline=True (no scheduler thread)")
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    trio.run(measure, args.inline, args.requests)


if __name__ == "__main__":
    main()
