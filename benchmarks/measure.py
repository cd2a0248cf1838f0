"""Measurement helpers shared by the benchmarks (:mod:`benchmarks.run`, :mod:`benchmarks.sglang`):
latency percentiles, a process tree's CPU ticks, the cost of an in-process tensor copy, the pauses of
full garbage collections."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

__all__ = [
    "W5_REQUESTS",
    "FullCollections",
    "copy_costs",
    "descendant_pids",
    "percentiles_ms",
    "proc_cpu_ticks",
    "time_streams",
]

#: W5's timed requests after its warm-up, on either runtime (``--quick``: 2). Its throughput and its
#: first chunk are medians over them; a first chunk swings by a millisecond from request to request,
#: so a median of 5 moved by as much from run to run.
W5_REQUESTS = 20


class FullCollections:
    """A ``gc.callbacks`` hook: when each full (generation 2) collection of this process began
    (``time.monotonic()``) and how long it took; :meth:`record` keeps them (override it to put them
    elsewhere)."""

    def __init__(self) -> None:
        self.began: list[float] = []
        self.pauses_ms: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.monotonic()
        else:
            self.record(self._start, (time.monotonic() - self._start) * 1000)

    def record(self, began: float, pause_ms: float) -> None:
        """One full collection: it began at ``began`` and stopped the process for ``pause_ms``."""
        self.began.append(began)
        self.pauses_ms.append(pause_ms)

    def count_between(self, first: float, last: float) -> int:
        """How many full collections began between the monotonic times ``first`` and ``last``."""
        return sum(1 for began in self.began if first <= began <= last)


def percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    """p50/p90/p99 (nearest rank) of durations in seconds, in milliseconds, with the sample count."""
    ordered = sorted(samples_s)

    def rank(p: float) -> float:
        index = min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))
        return ordered[index] * 1000

    return {"p50_ms": rank(50), "p90_ms": rank(90), "p99_ms": rank(99), "n": float(len(ordered))}


def proc_cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (from /proc/<pid>/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the full line)


def descendant_pids(root: int) -> list[int]:
    """Live processes descended from ``root`` (from /proc): workers forked by a template are its children."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        parent_of[int(entry.name)] = int(text[text.rindex(")") + 2:].split()[1])
    found: list[int] = []
    parents = {root}
    while parents:
        parents = {pid for pid, parent in parent_of.items() if parent in parents}
        found += sorted(parents)
    return found


def copy_costs(numel: int, runs: int) -> tuple[float, float]:
    """Median seconds of ``buf.copy_(t)`` into a preallocated buffer and of ``t.clone()``."""
    # Here, not at the top: the SGLang-Omni driver imports this module and needs torch only for W4.
    import torch

    t = torch.ones(numel, dtype=torch.float32)
    buf = torch.empty_like(t)
    buf.copy_(t)
    copies, clones = [], []
    for _ in range(runs):
        started = time.perf_counter()
        buf.copy_(t)
        copies.append(time.perf_counter() - started)
        started = time.perf_counter()
        c = t.clone()
        clones.append(time.perf_counter() - started)
        del c
    return statistics.median(copies), statistics.median(clones)


async def time_streams(
    open_stream: Callable[[str], AbstractAsyncContextManager[AsyncIterator[Any]]],
    is_chunk: Callable[[Any], bool],
    chunks: int,
    runs: int,
) -> dict[str, float]:
    """W5's measurement, the same on either runtime (it awaits nothing of trio's or asyncio's own).

    Streams one warm-up request and then ``runs`` more, one at a time, each opened with
    ``open_stream(request_id)`` and expected to yield ``chunks`` events for which ``is_chunk`` holds;
    returns the medians of their chunks per second and of the seconds to their first chunk (in ms).
    """
    rates, firsts = [], []
    for i in range(-1, runs):  # run -1 is a warm-up
        received = 0
        first = None
        started = time.perf_counter()
        async with open_stream(f"r-{i}") as events:
            async for event in events:
                if is_chunk(event):
                    if first is None:
                        first = time.perf_counter() - started
                    received += 1
        elapsed = time.perf_counter() - started
        if received != chunks:
            raise RuntimeError(f"received {received} chunks, expected {chunks}")
        if i >= 0 and first is not None:
            rates.append(received / elapsed)
            firsts.append(first)
    return {"chunks_per_s": statistics.median(rates), "first_chunk_ms": statistics.median(firsts) * 1000,
            "chunks_per_request": float(chunks)}
