"""Full garbage collections in W5's worker processes: how often they run and how long each holds its process.

Run: ``python -m benchmarks.gc_pauses [--requests 300] [--chunks 1000]`` (from the repository root, in the
test venv). Starts the bench's W5 pipeline (``bench_stages.stream_config``: a talker streaming small int64
chunks to a forwarding vocoder in another process), streams ``--requests`` requests one after the other,
and prints, for each worker process and for the caller's, every full (generation 2) collection it ran and
how long it took, the size of its permanent generation (``gc.get_freeze_count()``: what its full
collections skip), each worker's private memory before and after the requests (what it no longer
shares with the template it was forked from), and the requests' wall times (p50, p99, max).

The stage code is the bench's; this script's factories only add a ``gc.callbacks`` hook in each worker
(this module is imported there, as every stage module is), and the script the same hook in the caller,
that appends each full collection's duration to a file of the process's own in a temporary directory.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

import omni_trio as ot
from benchmarks import stages as bench_stages
from benchmarks.measure import FullCollections, descendant_pids

#: Where each worker appends its full collections (set by main() before the workers start).
PAUSES_DIR = "OMNI_TRIO_GC_PAUSES_DIR"


class _FullCollectionsToFile(FullCollections):
    """Appends ``<ms> <objects frozen>`` for each full collection to ``<dir>/<pid>`` (the workers' are
    read back by the caller)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self._directory = directory

    def record(self, began: float, pause_ms: float) -> None:
        """Append the pause to this process's file."""
        with open(os.path.join(self._directory, str(os.getpid())), "a", encoding="utf-8") as out:
            out.write(f"{pause_ms:.3f} {gc.get_freeze_count()}\n")


def _hook_this_process() -> None:
    directory = os.environ.get(PAUSES_DIR)
    if directory and not any(isinstance(cb, _FullCollectionsToFile) for cb in gc.callbacks):
        gc.callbacks.append(_FullCollectionsToFile(directory))


def create_chunk_talker(chunks: int = 1000) -> bench_stages.ChunkTalker:
    """The bench's talker, in a worker whose full collections are recorded."""
    _hook_this_process()
    return bench_stages.create_chunk_talker(chunks)


def create_forwarding_vocoder() -> bench_stages.ForwardingVocoder:
    """The bench's forwarding vocoder, in a worker whose full collections are recorded."""
    _hook_this_process()
    return bench_stages.create_forwarding_vocoder()


def _private_mb(pid: int) -> float:
    """The memory ``pid`` holds for itself alone (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup):
    a forked worker's pages stay the template's until something writes to them."""
    private_kb = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty"):
            private_kb += int(value.split()[0])
    return private_kb / 1024


def _workers() -> list[int]:
    return [pid for pid in descendant_pids(os.getpid())
            if "omni_trio.runtime.workers.worker" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]


async def _run(requests: int, chunks: int) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """The requests' wall times (ms), and each worker's private memory (MB) before and after them."""
    walls: list[float] = []
    with trio.fail_after(120 + requests * chunks / 1000):
        async with ot.open_pipeline(bench_stages.stream_config(chunks, "benchmarks.gc_pauses")) as pipeline:
            workers = _workers()
            before = {pid: _private_mb(pid) for pid in workers}
            for i in range(requests):
                start = time.perf_counter()
                async with pipeline.stream(f"r{i}", "x", params={"chunks": chunks}) as events:
                    async for _ in events:
                        pass
                walls.append((time.perf_counter() - start) * 1e3)
            memory = {pid: (before[pid], _private_mb(pid)) for pid in workers}
    return walls, memory


def main() -> None:
    """Parse the arguments, run the requests, print what each worker's full collections cost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=1000)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as directory:
        os.environ[PAUSES_DIR] = directory
        caller_hook = _FullCollectionsToFile(directory)
        gc.callbacks.append(caller_hook)
        try:
            walls, memory = trio.run(_run, args.requests, args.chunks)
        finally:
            gc.callbacks.remove(caller_hook)
        reports = {path.name: path.read_text().split("\n") for path in Path(directory).iterdir()}
    for name, lines in sorted(reports.items()):
        rows = [line.split() for line in lines if line]
        pauses = ", ".join(f"{float(ms):.1f}" for ms, _ in rows)
        who = "caller" if int(name) == os.getpid() else "worker"
        print(f"{who} {name}: {len(rows)} full collections ({pauses} ms); permanent generation "
              f"{rows[-1][1]} objects")
    if not reports:
        print("no process ran a full collection")
    for pid, (before, after) in sorted(memory.items()):
        print(f"worker {pid}: private memory {before:.1f} MB before the requests, {after:.1f} MB after")
    hundredths = statistics.quantiles(walls, n=100, method="inclusive")
    print(f"{len(walls)} requests of {args.chunks} chunks: wall p50 {statistics.median(walls):.1f} / "
          f"p99 {hundredths[98]:.1f} / max {max(walls):.1f} ms")


if __name__ == "__main__":
    main()
