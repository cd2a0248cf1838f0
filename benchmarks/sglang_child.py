"""SGLang-Omni's side of ``--vs-sglang-omni`` (:mod:`benchmarks.sglang`): the workloads, each run in
a child interpreter under asyncio (as SGLang-Omni needs) with ``benchmarks/sglang_shims`` first on its
``PYTHONPATH``:

    python -m benchmarks.sglang_child W1 [--quick]

prints the workload's metrics as one JSON line after :data:`RESULT_PREFIX`, with the same keys as
:mod:`benchmarks.run`. SGLang-Omni's own modules are imported inside the functions that use them, so
that the parent, which has no SGLang-Omni, can import this module for :data:`RESULT_PREFIX`. The
stages and configs are in :mod:`benchmarks.sglang_stages`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.measure import (
    W5_REQUESTS,
    copy_costs,
    descendant_pids,
    percentiles_ms,
    proc_cpu_ticks,
    time_streams,
)
from benchmarks.sglang_stages import MB, chain_config, fanin_config, stream_config, tensor_config

#: What starts the child's one line of metrics (JSON) on its stdout.
RESULT_PREFIX = "BENCH_SGLANG_RESULT "


# --------------------------------------------------------------------------- workloads (child side, asyncio)


class _Runner:
    """``async with _Runner(config) as coordinator``: SGLang-Omni's runner, started and always stopped."""

    def __init__(self, config: Any) -> None:
        from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

        self.runner = MultiProcessPipelineRunner(config)

    async def __aenter__(self) -> Any:
        await self.runner.start(timeout=300)
        return self.runner.coordinator

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.stop()


def _request(inputs: Any, **params: Any) -> Any:
    from sglang_omni.proto import OmniRequest

    return OmniRequest(inputs=inputs, params=params)


async def sequential_latency(config: Any, requests: int, warmup: int, inputs: Any = "x") -> dict[str, float]:
    """Run ``warmup`` then ``requests`` requests one after another; latency percentiles."""
    samples: list[float] = []
    async with _Runner(config) as coordinator:
        for i in range(warmup):
            await coordinator.submit(f"warm-{i}", inputs)
        for i in range(requests):
            started = time.perf_counter()
            await coordinator.submit(f"r-{i}", inputs)
            samples.append(time.perf_counter() - started)
    return percentiles_ms(samples)


async def w1(q: bool) -> dict[str, float]:
    """Chain of 2 no-op stages, sequential requests."""
    return await sequential_latency(chain_config(2), 20 if q else 500, 5 if q else 50)


async def w2(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, sequential requests."""
    return await sequential_latency(chain_config(4), 20 if q else 500, 5 if q else 50)


async def w3(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, many requests in flight: throughput."""
    total, in_flight = (200, 16) if q else (2000, 64)
    async with _Runner(chain_config(4)) as coordinator:
        for i in range(10):
            await coordinator.submit(f"warm-{i}", "x")
        next_id = 0

        async def client() -> None:
            nonlocal next_id
            while next_id < total:
                rid = next_id
                next_id += 1
                await coordinator.submit(f"r-{rid}", "x")

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
    return {"requests_per_s": total / elapsed, "requests": float(total), "in_flight": float(in_flight),
            "elapsed_s": elapsed}


async def w4(q: bool) -> dict[str, float]:
    """A float32 tensor from a source process to a sink process; compared with in-process copies."""
    sizes_mb = [1] if q else [4, 64]
    runs = 3 if q else 7
    result: dict[str, float] = {}
    async with _Runner(tensor_config()) as coordinator:
        for size in sizes_mb:
            numel = size * MB // 4
            await coordinator.submit(f"warm-{size}", _request("x", numel=numel))
            samples = []
            for i in range(runs):
                started = time.perf_counter()
                out = await coordinator.submit(f"r-{size}-{i}", _request("x", numel=numel))
                samples.append(time.perf_counter() - started)
                if out["numel"] != numel:
                    raise RuntimeError(f"sink saw {out['numel']} elements, expected {numel}")
            latency = statistics.median(samples)
            copy_s, clone_s = copy_costs(numel, max(runs, 5))
            result[f"{size}MB_latency_ms"] = latency * 1000
            result[f"{size}MB_MB_per_s"] = size / latency
            result[f"{size}MB_copy_ms"] = copy_s * 1000
            result[f"{size}MB_clone_ms"] = clone_s * 1000
            result[f"{size}MB_ratio_vs_copy"] = latency / copy_s
            result[f"{size}MB_ratio_vs_clone"] = latency / clone_s
    return result


async def w5(q: bool) -> dict[str, float]:
    """A talker streams small chunks to a forwarding vocoder in another process, which forwards them."""
    from sglang_omni.proto import StreamMessage

    chunks = 50 if q else 1000
    async with _Runner(stream_config(chunks)) as coordinator:
        return await time_streams(
            lambda request_id: contextlib.aclosing(coordinator.stream(request_id, _request("x", chunks=chunks))),
            lambda event: isinstance(event, StreamMessage),
            chunks,
            2 if q else W5_REQUESTS,
        )


async def w6(q: bool) -> dict[str, float]:
    """Fan-out and fan-in across four processes."""
    return await sequential_latency(fanin_config(), 20 if q else 500, 5 if q else 50, inputs="hello omni trio world")


async def w7(q: bool) -> dict[str, float]:
    """The 4-stage chain with every stage in one process."""
    return await sequential_latency(chain_config(4, one_process=True), 20 if q else 500, 5 if q else 50)


async def w8(q: bool) -> dict[str, float]:
    """Start-up (``start`` until ready) and shutdown (``stop``) of the 4-stage chain."""
    from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

    runs = 1 if q else 5
    starts, stops = [], []
    for i in range(runs):
        runner = MultiProcessPipelineRunner(chain_config(4))
        started = time.perf_counter()
        await runner.start(timeout=300)
        ready = time.perf_counter()
        try:
            await runner.coordinator.submit(f"check-{i}", "x")  # outside both timings
        finally:
            closing = time.perf_counter()
            await runner.stop()
        stops.append(time.perf_counter() - closing)
        starts.append(ready - started)
    return {"startup_ms": statistics.median(starts) * 1000, "shutdown_ms": statistics.median(stops) * 1000,
            "runs": float(runs)}


async def idle(q: bool) -> dict[str, float]:
    """CPU of a started, idle 4-stage pipeline: this process and its worker processes."""
    seconds = 0.5 if q else 3.0
    async with _Runner(chain_config(4)) as coordinator:
        await coordinator.submit("warm", "x")
        await asyncio.sleep(0.2)
        pids = [os.getpid(), *descendant_pids(os.getpid())]
        before = {pid: proc_cpu_ticks(pid) for pid in pids}
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        after = {pid: proc_cpu_ticks(pid) for pid in pids}
        elapsed = time.perf_counter() - started
    ticks = sum(after[pid] - before[pid] for pid in pids)
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    return {"cpu_percent_of_core": 100 * cpu_s / elapsed, "processes": float(len(pids)), "seconds": elapsed,
            "cpu_ticks": float(ticks)}


WORKLOADS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, "W7": w7, "W8": w8, "idle": idle}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: run one workload on SGLang-Omni and print its metrics as one JSON line."""
    parser = argparse.ArgumentParser(prog="benchmarks.sglang_child",
                                     description="One benchmark workload on SGLang-Omni (a child of bench).")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    metrics = asyncio.run(WORKLOADS[args.workload](args.quick))
    if not all(math.isfinite(value) for value in metrics.values()):
        raise RuntimeError(f"non-finite metric in {metrics}")
    print(RESULT_PREFIX + json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
