"""Aborts under load: ``python -m benchmarks.aborts [--requests 10000] [--abort-fraction 0.9] [--json PATH]``.

A chain ``front -> slow -> back``, each stage in its own worker process; the middle stage holds
each request for :data:`SLOW_S` outside the GIL (``time.sleep`` on its scheduler thread, like a
device kernel), one at a time, and writes the id and start time of every request it computes to
a file the benchmark reads back. All requests are submitted at once (``max_in_flight`` is left
unlimited, the default), and ``--abort-fraction`` of them, chosen at random, are aborted each at a
random moment up to ``--abort-window`` seconds after its submit began. With ``--rate R`` the
requests are submitted at R per second instead (a server's arrivals), still all in flight together
when the slow stage is behind.

Reported: the latency of ``pipeline.abort()`` (p50/p90/p99/max, ms), how many aborted requests
the slow stage computed after their abort was called (``computed_after_abort``: work an abort
should have prevented) and before (``computed_before_abort``: done before anybody asked), the
total time, the caller's full garbage collections (each one's pause, and how many began while
aborts were being called: nothing in the caller runs during one), and the checks: every request
resolved exactly once (a result, or :class:`~omni_trio.RequestAborted` when its ``abort()``
returned True), and ``stats()`` is idle afterwards. Lab notes: benchmarks/ABORT_NOTES.md;
figures: docs/performance.md, "Aborts under load".
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from benchmarks.measure import FullCollections
from omni_trio.config import PipelineConfig, StageConfig
from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler

M = "benchmarks.aborts"
#: How long the slow stage holds each request (outside the GIL).
SLOW_S = 0.003


def create_pass() -> SimpleScheduler:
    """A stage that forwards its payload, on its event loop."""
    return SimpleScheduler(lambda payload: payload, inline=True)


def create_slow(record: str) -> SimpleScheduler:
    """A stage that holds each request for :data:`SLOW_S` on its scheduler thread, one at a time,
    and appends ``"<request id> <time.monotonic()>"`` to the file ``record`` as each compute starts."""
    # Line-buffered: each line is written as its compute starts; the benchmark reads the file once
    # the pipeline is closed (the worker has exited, so everything is on disk).
    out = open(record, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the stage's life

    def slow(payload: StagePayload) -> StagePayload:
        out.write(f"{payload.request_id} {time.monotonic()}\n")
        time.sleep(SLOW_S)
        return payload

    return SimpleScheduler(slow, shutdown_callback=out.close)


def chain(record: str) -> PipelineConfig:
    """front -> slow -> back, one worker process each."""
    return PipelineConfig(
        name="bench-aborts",
        stages=[
            StageConfig(name="front", process="p_front", factory_path=f"{M}.create_pass", next="slow"),
            StageConfig(
                name="slow", process="p_slow", factory_path=f"{M}.create_slow", factory={"record": record},
                next="back",
            ),
            StageConfig(name="back", process="p_back", factory_path=f"{M}.create_pass", terminal=True),
        ],
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run(
    requests: int, abort_fraction: float, abort_window_s: float, seed: int, trace: str | None, rate: float = 0.0
) -> dict[str, Any]:
    """Run the benchmark once; the figures and checks as a dict (see the module docstring)."""
    rng = random.Random(seed)
    aborted = set(rng.sample(range(requests), round(requests * abort_fraction)))
    # request id -> (when abort() was called, time.monotonic(); its latency in s; what it returned)
    abort_calls: dict[str, tuple[float, float, bool]] = {}
    outcomes: dict[str, list[str]] = {}
    in_flight = [0, 0]  # submits under way now, and the most at once
    full_collections = FullCollections()
    gc.callbacks.append(full_collections)
    with tempfile.TemporaryDirectory(prefix="bench-aborts-") as tmp:
        record = Path(tmp) / "computed.txt"
        started = time.perf_counter()
        async with ot.open_pipeline(chain(str(record)), trace=trace) as pipeline:

            async def one(index: int, delay: float | None) -> None:
                request_id = f"r{index}"

                async def submit() -> None:
                    begun.set()
                    in_flight[0] += 1
                    in_flight[1] = max(in_flight)
                    try:
                        await pipeline.submit(request_id, {"i": index})
                        outcomes.setdefault(request_id, []).append("result")
                    except ot.RequestAborted:
                        outcomes.setdefault(request_id, []).append("aborted")
                    except Exception as exc:  # noqa: BLE001 - counted and reported: the check fails
                        outcomes.setdefault(request_id, []).append(f"error: {exc!r}")
                    finally:
                        in_flight[0] -= 1

                begun = trio.Event()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit)
                    if delay is not None:
                        # Admitted first: the submit admits its request before its first checkpoint.
                        await begun.wait()
                        await trio.sleep(delay)
                        called = time.monotonic()
                        begin = time.perf_counter()
                        accepted = await pipeline.abort(request_id)
                        abort_calls[request_id] = (called, time.perf_counter() - begin, accepted)

            async with trio.open_nursery() as nursery:
                first = trio.current_time()
                for index in range(requests):
                    if rate:
                        await trio.sleep_until(first + index / rate)
                    delay = rng.uniform(0.0, abort_window_s) if index in aborted else None
                    nursery.start_soon(one, index, delay)
            elapsed = time.perf_counter() - started
            stats = await pipeline.stats()
        gc.callbacks.remove(full_collections)
        computed: dict[str, float] = {}
        for line in record.read_text(encoding="utf-8").splitlines():
            request_id, at = line.split()
            computed.setdefault(request_id, float(at))
    latencies_ms = [latency * 1000 for _, latency, _ in abort_calls.values()]
    accepted_aborts = {rid for rid, (_, _, accepted) in abort_calls.items() if accepted}
    after = sum(1 for rid in accepted_aborts if rid in computed and computed[rid] >= abort_calls[rid][0])
    before = sum(1 for rid in accepted_aborts if rid in computed and computed[rid] < abort_calls[rid][0])
    wrong = {
        rid: seen
        for rid, seen in outcomes.items()
        if seen != (["aborted"] if rid in accepted_aborts else ["result"])
    }
    return {
        "requests": requests,
        "submit_rate": rate or "all at once",
        "gc_tuned": gc.get_freeze_count() > 0,
        "peak_in_flight": in_flight[1],
        "aborts_called": len(abort_calls),
        "aborts_accepted": len(accepted_aborts),
        "abort_window_s": abort_window_s,
        "slow_stage_ms": SLOW_S * 1000,
        "abort_p50_ms": round(percentile(latencies_ms, 0.50), 3),
        "abort_p90_ms": round(percentile(latencies_ms, 0.90), 3),
        "abort_p99_ms": round(percentile(latencies_ms, 0.99), 3),
        "abort_max_ms": round(max(latencies_ms, default=0.0), 3),
        "computed_after_abort": after,
        "computed_before_abort": before,
        "slow_stage_computed": len(computed),
        "total_s": round(elapsed, 3),
        "caller_full_gc_ms": [round(ms, 1) for ms in full_collections.pauses_ms],
        "full_gc_during_aborts": full_collections.count_between(
            min((called for called, _, _ in abort_calls.values()), default=0.0),
            max((called + latency for called, latency, _ in abort_calls.values()), default=0.0),
        ),
        "resolved_once": len(outcomes) == requests and not wrong,
        "wrongly_resolved": dict(list(wrong.items())[:5]),
        "idle_after": stats.idle,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print its figures (and write them as JSON with ``--json``); 1 if a check failed."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.aborts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--abort-fraction", type=float, default=0.9)
    parser.add_argument("--abort-window", type=float, default=1.0, help="aborts come up to this many s after submit")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="submit this many requests per second (default 0: all at once)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune-gc", action="store_true",
                        help="tune the caller's garbage collector first, as docs/reliability.md advises a "
                             "caller holding thousands of requests (gc.freeze(), gc.set_threshold(700, 10, 1000))")
    parser.add_argument("--trace", help="write the run's trace here (docs/tracing.md)")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.tune_gc:
        # The imports' objects leave the full collections, which then come ten times less often.
        gc.freeze()
        gc.set_threshold(700, 10, 1000)
    figures = trio.run(run, args.requests, args.abort_fraction, args.abort_window, args.seed, args.trace, args.rate)
    for name, value in figures.items():
        print(f"{name:>24}: {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if figures["resolved_once"] and figures["idle_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
