"""The caller of the cross-host tests, run in its own network namespace: ``python -m
tests.crosshost_caller SCENARIO MAIN_HOST FAR_HOST [TRACE]``.

It opens a pipeline with one ``manual`` process group on FAR_HOST (the test starts that worker in
the other namespace, from the command the runtime logs) and prints what the test checks, one
``KEY value`` line each: ``READY``, ``RESULT <json>``, ``REFUSED <json>``, ``FAILED <error> <time>``
(``time.monotonic()``: one clock for every namespace of the machine).
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import attrs
import trio
import trio.testing

import omni_trio as ot
from examples import ch6_pipeline
from examples.ch4_fanin import make_config
from omni_trio.serve.metrics import Metrics

M = "tests.crosshost_stages"


def _say(key: str, value: Any = "") -> None:
    print(key, value if isinstance(value, str) else json.dumps(value), flush=True)


def fanin_config(main_host: str, far_host: str) -> ot.PipelineConfig:
    """The chapter's fan-in with ``upper`` on the far host and ``count`` in a local worker."""
    base = make_config("embedded")
    places = {"upper": "p_upper", "count": "p_count"}
    return attrs.evolve(
        base,
        stages=[attrs.evolve(s, process=places.get(s.name)) for s in base.stages],
        processes={
            "main": ot.ProcessConfig(host=main_host),
            "p_upper": ot.ProcessConfig(launcher="manual", host=far_host),
        },
    )


def tensor_config(main_host: str, far_host: str, far_factory: str = "create_scale") -> ot.PipelineConfig:
    """``make`` -> (``far`` on the far host, ``near`` in a local worker) -> ``join``, 4 MiB tensors on every edge."""
    far_kwargs = {"factor": 2.0} if far_factory == "create_scale" else {}
    return ot.PipelineConfig(
        entry_stage="make",
        stages=[
            ot.StageConfig(name="make", factory_path=f"{M}.create_make", next=["far", "near"]),
            ot.StageConfig(name="far", process="p_far", factory_path=f"{M}.{far_factory}", factory=far_kwargs,
                           next="join"),
            ot.StageConfig(name="near", process="p_near", factory_path=f"{M}.create_scale", factory={"factor": 3.0},
                           next="join"),
            ot.StageConfig(name="join", factory_path=f"{M}.create_join", wait_for=["far", "near"],
                           merge_fn=f"{M}.merge", terminal=True),
        ],
        processes={
            "main": ot.ProcessConfig(host=main_host),
            "p_far": ot.ProcessConfig(launcher="manual", host=far_host),
        },
    )


def chain_config(main_host: str, far_host: str, restart: bool = False) -> ot.PipelineConfig:
    """``make`` (caller) -> ``a`` (local worker) -> ``far`` (the far host) -> ``b`` (local worker) ->
    ``total`` (caller): two worker <-> worker edges cross the hosts, 4 MiB tensors on every edge.
    With ``restart``, ``a`` is restarted after it died (a request with the ``crash`` param kills it)."""
    scale = f"{M}.create_scale"
    a: dict[str, Any] = {"factory": {"factor": 2.0}}
    if restart:
        a = {"factory": {"factor": 2.0, "crash": True}, "restart": "on-failure"}
    return ot.PipelineConfig(
        entry_stage="make",
        stages=[
            ot.StageConfig(name="make", factory_path=f"{M}.create_make", next="a"),
            ot.StageConfig(name="a", process="p_a", factory_path=scale, next="far", **a),
            ot.StageConfig(name="far", process="p_far", factory_path=scale, factory={"factor": 3.0}, next="b"),
            ot.StageConfig(name="b", process="p_b", factory_path=scale, factory={"factor": 5.0}, next="total"),
            ot.StageConfig(name="total", factory_path=f"{M}.create_total", terminal=True),
        ],
        processes={
            "main": ot.ProcessConfig(host=main_host),
            "p_far": ot.ProcessConfig(launcher="manual", host=far_host),
        },
    )


async def _three_tensor_requests(config: ot.PipelineConfig) -> None:
    """Three requests of 4 MiB tensors; then what the run refused, and the results."""
    async with ot.open_pipeline(config, start_timeout=30) as pipeline:
        _say("READY")
        result = [await pipeline.submit(f"r{i}", "x", params={"numel": 1 << 20}) for i in range(3)]
        _say("REFUSED", (await pipeline.stats()).refused_frames)
    _say("RESULT", result)


async def chain(main_host: str, far_host: str) -> None:
    await _three_tensor_requests(chain_config(main_host, far_host))


async def restart(main_host: str, far_host: str) -> None:
    numel = {"numel": 1 << 20}
    async with ot.open_pipeline(chain_config(main_host, far_host, restart=True), start_timeout=30) as pipeline:
        first = await pipeline.submit("r0", "x", params=numel)
        try:
            await pipeline.submit("r1", "x", params={**numel, "crash": True})
        except ot.StageProcessDied as exc:
            _say("FAILED", type(exc).__name__)
        # Waits while p_a restarts; then crosses to the far worker and back again.
        result = [first, await pipeline.submit("r2", "x", params=numel)]
        _say("REFUSED", (await pipeline.stats()).refused_frames)
    _say("RESULT", result)


async def fanin(main_host: str, far_host: str) -> None:
    results: dict[int, object] = {}
    async with ot.open_pipeline(fanin_config(main_host, far_host), start_timeout=30) as pipeline:
        _say("READY")

        async def submit(index: int, text: str) -> None:
            results[index] = await pipeline.submit(f"r{index}", text)

        async with trio.open_nursery() as nursery:
            for index, text in enumerate(["hello omni world", "stage by stage"]):
                nursery.start_soon(submit, index, text)
        _say("REFUSED", (await pipeline.stats()).refused_frames)
    _say("RESULT", [str(results[index]) for index in sorted(results)])


async def tensors(main_host: str, far_host: str) -> None:
    await _three_tensor_requests(tensor_config(main_host, far_host))


async def transport(main_host: str, far_host: str) -> None:
    """The chapter's transport experiment (``examples/ch6_pipeline.py``, the ``big`` run) with ``far`` on
    the far host: ``src`` and ``near`` share a local worker, so ``src -> far`` is a worker <-> worker edge
    across the hosts. Traced to ``sys.argv[4]``; prints the result and the chapter's per-edge summary."""
    trace = sys.argv[4]
    config = attrs.evolve(
        ch6_pipeline.make_config(big_chunk=True),
        processes={
            "main": ot.ProcessConfig(host=main_host),
            "p_far": ot.ProcessConfig(launcher="manual", host=far_host),
        },
    )
    async with ot.open_pipeline(config, trace=trace, start_timeout=30) as pipeline:
        _say("READY")
        result = await pipeline.submit("r0", "go")
    _say("RESULT", result)
    _say("SUMMARY", ch6_pipeline.summarize(trace))


async def killed(main_host: str, far_host: str) -> None:
    try:
        async with ot.open_pipeline(tensor_config(main_host, far_host, "create_block"), start_timeout=30) as pipeline:
            _say("READY")
            await pipeline.submit("r0", "x", params={"numel": 1 << 20})
    except Exception as exc:  # noqa: BLE001 - what the test checks
        _say("FAILED", f"{type(exc).__name__} {time.monotonic()!r}")
        _say("ERROR", str(exc))
        return
    _say("RESULT", "the request did not fail")


def replicas_config(main_host: str, far_host: str) -> ot.PipelineConfig:
    """``make`` -> ``where``, a ``manual`` group of 2 replicas: ``p_rep@r0`` on the caller's host,
    ``p_rep@r1`` on the far host (restarted once on failure); 4 MiB tensors."""
    return ot.PipelineConfig(
        entry_stage="make",
        stages=[
            ot.StageConfig(name="make", factory_path=f"{M}.create_make", next="where"),
            ot.StageConfig(name="where", process="p_rep", factory_path=f"{M}.create_where", terminal=True,
                           replicas=2),
        ],
        processes={
            "main": ot.ProcessConfig(host=main_host),
            "p_rep": ot.ProcessConfig(launcher="manual", hosts=[main_host, far_host], restart="on-failure",
                                      max_restarts=1),
        },
    )


async def replicas(main_host: str, far_host: str) -> None:
    """8 requests over both replicas (``SERVED``); one held request per replica (``HELD``): the test
    kills ``p_rep@r1``'s worker, its request fails (``FAILED``), replica 0 keeps serving (``DEGRADED``);
    the test starts ``p_rep@r1`` again, which serves the next request; then the run's state."""
    params = {"numel": 1 << 20}
    outcomes: dict[str, str] = {}
    died = trio.Event()
    async with ot.open_pipeline(replicas_config(main_host, far_host), start_timeout=30) as pipeline:
        _say("READY")
        served: list[Any] = []

        async def one(rid: str) -> None:
            served.append(await pipeline.submit(rid, "x", params=params))

        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, f"r{i}")
        _say("SERVED", sorted([r["replica"], r["pid"]] for r in served))

        async def held(rid: str) -> None:
            try:
                await pipeline.submit(rid, "x", params={**params, "block": True})
            except ot.StageProcessDied as exc:
                outcomes[rid] = exc.process
                died.set()
            except ot.RequestAborted:
                outcomes[rid] = "aborted"

        async with trio.open_nursery() as nursery:
            for rid in ("h0", "h1"):
                nursery.start_soon(held, rid)
                await trio.testing.wait_all_tasks_blocked()  # bound before the next one
            _say("HELD")
            await died.wait()
            _say("FAILED", outcomes)
            stats = await pipeline.stats()
            during = [(await pipeline.submit(f"c{i}", "x", params=params))["replica"] for i in range(3)]
            _say("DEGRADED", {"down": stats.down_replicas, "health": pipeline.health().processes, "served": during})
            while (await pipeline.stats()).degraded:  # the test starts p_rep@r1 again
                await trio.sleep(0.05)
            back = await pipeline.submit("d", "x", params=params)
            _say("BACK", [back["replica"], back["pid"]])
            kept = next(rid for rid in ("h0", "h1") if rid not in outcomes)
            await pipeline.abort(kept)
        stats = await pipeline.stats()
        metrics = Metrics("m")
        metrics.runtime.observe(stats)
        named = sorted(set(re.findall(r'process="([^"]+)"', metrics.render().decode())))
        _say("STATE", {"idle": stats.idle, "stages": sorted(stats.stages), "health": pipeline.health().processes,
                       "outcomes": outcomes, "metrics": named})


async def partition(main_host: str, far_host: str) -> None:
    """``p_far`` restarts on failure: r0 is served, r1 fails when the test cuts the link (``FAILED``),
    r2 waits for the worker the test starts again, and is served by it; then the caller's state."""
    config = tensor_config(main_host, far_host, "create_hold_slot")
    changes: dict[str, dict[str, Any]] = {
        "far": {"restart": "on-failure", "max_restarts": 1},
        "near": {"factory": {"factor": 3.0, "blocks": False}},  # only the far worker holds r1
    }
    config = attrs.evolve(config, stages=[attrs.evolve(s, **changes.get(s.name, {})) for s in config.stages])
    params = {"numel": 1 << 20}
    async with ot.open_pipeline(config, start_timeout=30) as pipeline:
        _say("READY")
        results = [await pipeline.submit("r0", "x", params=params)]
        try:
            await pipeline.submit("r1", "x", params={**params, "block": True})
        except ot.StageProcessDied as exc:
            _say("FAILED", f"{type(exc).__name__} {time.monotonic()!r}")
        results.append(await pipeline.submit("r2", "x", params=params))
        stats = await pipeline.stats()
        _say("STATE", {"idle": stats.idle, "live": stats.live_requests, "health": pipeline.health().processes,
                       "stages": {name: attrs.asdict(s) for name, s in stats.stages.items() if not s.idle},
                       "superseded": stats.superseded_messages})
    _say("RESULT", results)


def main() -> None:
    """Run one scenario."""
    scenario, main_host, far_host = sys.argv[1:4]
    scenarios = {
        "fanin": fanin,
        "tensors": tensors,
        "chain": chain,
        "restart": restart,
        "killed": killed,
        "partition": partition,
        "replicas": replicas,
        "transport": transport,
    }
    trio.run(scenarios[scenario], main_host, far_host)


if __name__ == "__main__":
    main()
