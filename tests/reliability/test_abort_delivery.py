"""Aborts arrive, always: the measured scenarios of issue #12 at a size that fits CI.

Three stages in three worker processes, ``a -> b -> c``, the middle one slow, ``c`` a fan-in of ``a``
and ``b`` (so it holds ``a``'s partial input while ``b`` works); thousands of requests in flight and
95 % of them aborted, once with every process responsive and once while ``b``'s process
holds the GIL for two seconds (as a model load or a long CPU step does). After the storm, before any
settling time:

- every stage of every process holds nothing (0 active requests, 0 queued inbox entries, 0 partial
  fan-in inputs, ...);
- no stage started computing a request after ``abort()`` returned True for it (each counted stage
  logs its compute starts with the machine-wide monotonic clock), and ``b`` computed few of the
  aborted ones (only those it had started before the abort);
- a fresh request completes at once.

A request aborted before it began sending (it waited for its turn in a burst) asks no worker to
drop it: its abort does not wait for a worker that cannot answer.

Before the fix the broadcast dropped aborts at the XPUB high-water mark: ``b`` computed aborted
requests after ``abort()`` had returned True, and held lost ones for good.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.control import aborts as aborts_module
from omni_trio.coordinator.send_pacing import PER_PASS
from tests.process import helpers
from tests.reliability.abort_stages import HOG, read_starts

S = "tests.reliability.abort_stages"

N_REQUESTS = 5000
ABORTED_SHARE = 0.95
HOG_S = 2.0
#: How long a caller waits for every process's confirmation of an abort (5 s by default), raised so
#: that an abort that takes long on a loaded machine is told apart from one that never arrives.
CONFIRM_WAIT_S = 20.0


@pytest.fixture(autouse=True)
def long_confirm_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aborts_module, "WAIT_BOUND_S", CONFIRM_WAIT_S)


def chain_config(base: Path, *, hog_s: float = 0.0, **b_kwargs: float) -> ot.PipelineConfig:
    """``a -> b -> c``, one worker process each, every compute start logged under ``base``; with
    ``hog_s``, a stage ``h`` beside ``b`` in its process holds the GIL that long for the HOG request."""

    def counted(name: str, process: str, **kwargs: Any) -> dict[str, Any]:
        return {"name": name, "factory_path": f"{S}.create_counted", "process": process,
                "factory": {"tag": name, "log_path": str(base / f"{name}.log"), **kwargs}}

    stages = [
        ot.StageConfig(**counted("a", "pa"), next=["b", "c", "h"] if hog_s else ["b", "c"],
                       route_fn=f"{S}.route_hog" if hog_s else None),
        ot.StageConfig(**counted("b", "pb", **b_kwargs), next="c"),
        ot.StageConfig(**counted("c", "pc"), terminal=True, wait_for=["a", "b"], merge_fn=f"{S}.merge_from_b"),
    ]
    if hog_s:
        stages.append(ot.StageConfig(**counted("h", "pb", hog_s=hog_s), terminal=True))
    return helpers.config(base, *stages, entry_stage="a",
                          terminal_stages_fn=f"{S}.hog_terminal" if hog_s else None)


async def wait_for_line(path: Path, word: str, timeout: float = 10.0) -> None:
    """Until a line of ``path`` starts with ``word`` (a worker's stage writes it; bounded polling)."""
    with trio.fail_after(timeout):
        while not any(line.startswith(f"{word} ") for line in path.read_text().splitlines()):
            await trio.sleep(0.01)


async def wait_for_lines(path: Path, count: int, timeout: float = 30.0) -> None:
    """Until ``path`` has ``count`` lines (a worker's stage writes them; bounded polling)."""
    with trio.fail_after(timeout):
        while len(path.read_text().splitlines()) < count:
            await trio.sleep(0.05)


async def storm(
    pipeline: ot.Pipeline, seed: int, in_flight: Path, before_aborts: Callable[[], Awaitable[object]]
) -> tuple[dict[str, Any], dict[str, float], list[float]]:
    """Submit N requests at once and, once every one has reached the stage logging to ``in_flight``
    and ``before_aborts()`` returned, abort 95 % of them all together.

    Returns each request's outcome, the monotonic time each abort that returned True returned, and
    every abort's latency (call to return) in seconds.
    """
    rng = random.Random(seed)
    # Ids as long as a serving front end's (``chatcmpl-`` and a UUID's hex, and more).
    rids = [f"req-{i:05d}-{rng.randbytes(32).hex()}" for i in range(N_REQUESTS)]
    doomed = set(rng.sample(rids, int(N_REQUESTS * ABORTED_SHARE)))
    outcomes: dict[str, Any] = {}
    confirmed: dict[str, float] = {}
    latencies: list[float] = []

    async def run_one(rid: str) -> None:
        try:
            outcomes[rid] = await pipeline.submit(rid, rid)
        except ot.RequestAborted as exc:
            outcomes[rid] = exc

    async def abort_now(rid: str) -> None:
        start = time.monotonic()
        if await pipeline.abort(rid):
            confirmed[rid] = time.monotonic()
        latencies.append(time.monotonic() - start)

    async with trio.open_nursery() as nursery:
        for rid in rids:
            nursery.start_soon(run_one, rid)
        await wait_for_lines(in_flight, N_REQUESTS)
        await before_aborts()
        for rid in sorted(doomed):
            nursery.start_soon(abort_now, rid)
    return outcomes, confirmed, latencies


def check_after_storm(
    base: Path,
    stats: ot.PipelineStats,
    outcomes: dict[str, Any],
    confirmed: dict[str, float],
    latencies: list[float],
) -> dict[str, int]:
    """The storm's assertions; returns per stage how many aborted requests it computed."""
    # Every abort was confirmed by every process before its caller's wait for that ran out: none was lost.
    slowest = max(latencies)
    assert slowest < CONFIRM_WAIT_S, f"an abort was not confirmed by every process within {CONFIRM_WAIT_S} s"
    for name, counters in stats.stages.items():
        assert counters.active_requests == 0, (name, counters)
        assert counters.queued_inbox == 0, (name, counters)
        assert counters.pending_fan_in == 0, (name, counters)
        assert counters.idle, (name, counters)
    assert stats.live_requests == 0
    assert len(outcomes) == N_REQUESTS
    for rid, outcome in outcomes.items():
        if isinstance(outcome, ot.RequestAborted):
            assert rid in confirmed, rid
        else:
            assert outcome == {"trail": ["a", "b", "c"]}, (rid, outcome)
    computed_aborted = {}
    for name in ("a", "b", "c"):
        starts = read_starts(str(base / f"{name}.log"))
        late = sorted(rid for rid, at in confirmed.items() if any(t > at for t in starts.get(rid, ())))
        assert not late, f"stage {name} computed {len(late)} requests after their abort returned: {late[:5]}"
        computed_aborted[name] = sum(1 for rid in confirmed if rid in starts)
    # b is slow (a few ms a request): it can only have started the few it reached before their abort.
    assert computed_aborted["b"] < len(confirmed) // 4, computed_aborted
    return computed_aborted


def figures(name: str, latencies: list[float], confirmed: dict[str, float], computed: dict[str, int]) -> str:
    q = statistics.quantiles(latencies, n=100)
    return (f"FIGURES {name}: requests={N_REQUESTS} abort_calls={len(latencies)} aborted={len(confirmed)} "
            f"aborts_lost=0 abort_ms_p50={q[49] * 1000:.1f} abort_ms_p99={q[98] * 1000:.1f} "
            f"abort_ms_max={max(latencies) * 1000:.1f} aborted_computed={computed}")


async def test_abort_storm_with_a_slow_middle_stage(ipc_base: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(chain_config(ipc_base, sleep_s=0.005)) as pipeline:
            outcomes, confirmed, latencies = await storm(pipeline, 12, ipc_base / "a.log", trio.lowlevel.checkpoint)
            stats = await pipeline.stats()
            computed = check_after_storm(ipc_base, stats, outcomes, confirmed, latencies)
            with trio.fail_after(5):
                assert await pipeline.submit("fresh", "fresh") == {"trail": ["a", "b", "c"]}
    print(f"\n{figures('abort_storm', latencies, confirmed, computed)}")


async def test_abort_storm_while_a_process_holds_the_gil(ipc_base: Path) -> None:
    config = chain_config(ipc_base, sleep_s=0.005, hog_s=HOG_S)
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            hog: list[Any] = []

            async def run_hog() -> None:
                hog.append(await pipeline.submit(HOG, HOG))

            async def hold_the_gil_in_b_process() -> None:
                nursery.start_soon(run_hog)
                # From here b's process runs nothing else (its trio loop included) for HOG_S seconds.
                await wait_for_line(ipc_base / "h.log", HOG)

            outcomes, confirmed, latencies = await storm(pipeline, 13, ipc_base / "a.log", hold_the_gil_in_b_process)
            stats = await pipeline.stats()
            computed = check_after_storm(ipc_base, stats, outcomes, confirmed, latencies)
            with trio.fail_after(5):
                assert await pipeline.submit("fresh", "fresh") == {"trail": ["a", "b", "c"]}
            assert hog == [{"trail": ["a", "h"]}]
    print(f"\n{figures('abort_storm_gil_held', latencies, confirmed, computed)}")


async def test_an_abort_of_a_request_that_never_left_asks_no_worker(
    ipc_base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker is stopped: an abort sent to it waits for its confirmation up to the bound.
    monkeypatch.setattr(aborts_module, "WAIT_BOUND_S", 2.0)
    config = helpers.config(ipc_base, ot.StageConfig(
        name="record", factory_path="tests.stages.create_append", factory={"tag": "a"}, process="p_record",
        terminal=True,
    ))
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            (worker,) = [pid for pid, cmd in helpers.worker_processes().items() if cmd.endswith("/p_record.spec")]
            os.kill(worker, signal.SIGSTOP)
            try:

                async def submit(request_id: str) -> None:
                    with contextlib.suppress(ot.RequestAborted):  # or served, once the worker runs again
                        await pipeline.submit(request_id, "x")

                nursery.start_soon(submit, "sent")  # alone: it starts sending at once
                await trio.sleep(0.1)
                for index in range(100 * PER_PASS):
                    nursery.start_soon(submit, f"r{index}")
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                # Never sent: nothing to confirm, so it is done within the call (no schedule point).
                with trio.testing.assert_no_checkpoints():
                    assert await pipeline.abort(f"r{50 * PER_PASS}") is True
                began = trio.current_time()
                assert await pipeline.abort("sent") is True  # sent: it waits for the stopped worker
                assert trio.current_time() - began >= 1.5
            finally:
                os.kill(worker, signal.SIGCONT)
            for request_id in ["sent", *(f"r{index}" for index in range(100 * PER_PASS))]:
                await pipeline.abort(request_id)
