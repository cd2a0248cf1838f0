"""Stage replicas: ``replicas=2`` runs a stage's group as ``p_<name>@r0`` and ``p_<name>@r1``.

Each pipeline test runs with the other stages embedded in the caller and with every stage in a
worker process. Which replica served a request is read from the replica's own state (its label,
its process id, what it recorded), never from the runtime's bookkeeping.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import trio

import omni_trio as ot
from omni_trio.config import check_imports
from omni_trio.control.bindings import BindingTable
from omni_trio.coordinator.replicas import LeastInFlight, ReplicaLoad
from omni_trio.tracing import views as traceview
from tests.placement import place, stage
from tests.process import helpers

PLACEMENTS = pytest.mark.parametrize("omni_placement", ["embedded", "processes"], indirect=True)


def replicated(base: Path, placement: str, *stages: ot.StageConfig, **kwargs: object) -> ot.PipelineConfig:
    return helpers.config(base, *place(list(stages), placement), **kwargs)


def vocoder_pipeline(base: Path, placement: str) -> ot.PipelineConfig:
    """A talker streaming 5 chunks into a vocoder with 2 replicas (labelled by a ``{replica}`` placeholder)."""
    return replicated(
        base,
        placement,
        stage("talker", "create_producer", factory={"chunks": 5, "numel": 4}, next="voc", stream_to=["voc"]),
        stage("voc", "create_replica_vocoder", factory={"label": "voc-{replica}"}, terminal=True,
              can_accept_stream_before_payload=True, replicas=2),
    )


def holder_pipeline(base: Path, placement: str, **kwargs: object) -> ot.PipelineConfig:
    """first -> hold (2 replicas, each reporting ``<replica> <pid>`` per request, then blocking)."""
    return replicated(
        base,
        placement,
        stage("first", "create_append", factory={"tag": "first"}, next="hold"),
        stage("hold", "create_replica_holder", terminal=True, replicas=2, **kwargs),
    )


@PLACEMENTS
async def test_every_chunk_of_a_request_reaches_one_replica_and_load_spreads(
    ipc_base: Path, omni_placement: str, tmp_path: Path
) -> None:
    results: dict[str, dict[str, object]] = {}
    trace = tmp_path / "run.jsonl"
    with trio.fail_after(60):
        async with ot.open_pipeline(vocoder_pipeline(ipc_base, omni_placement), trace=trace) as pipeline:

            async def one(rid: str) -> None:
                results[rid] = await pipeline.submit(rid, "go")

            async with trio.open_nursery() as nursery:
                for i in range(16):
                    nursery.start_soon(one, f"r{i}")
            stats = await pipeline.stats()
            assert stats.idle and not stats.degraded, stats
            assert {"voc@r0", "voc@r1"} <= set(stats.stages) and "voc" not in stats.stages
    # The replica that completed a request saw every one of its chunks, in order.
    assert all(result["chunks"] == [0, 1, 2, 3, 4] for result in results.values()), results
    by_label: dict[object, set[object]] = {}
    for result in results.values():
        by_label.setdefault(result["label"], set()).add(result["pid"])
    # Both replicas worked (least in flight alternates), each in a process of its own.
    assert sorted(by_label) == ["voc-0", "voc-1"]
    assert all(len(pids) == 1 for pids in by_label.values())
    assert by_label["voc-0"] != by_label["voc-1"]
    # The trace says which replica did what: events carry ``replica``, the summary has a row per
    # replica, the timeline a track per replica.
    events = ot.read_trace(trace)
    assert {e.get("replica") for e in events if e["event"] == "stage_dispatch" and e["stage"] == "voc"} == {0, 1}
    busy = {row.stage: row.count for row in traceview.summarize(events).stages}
    assert busy["voc@r0"] + busy["voc@r1"] == 16 and busy["voc@r0"] > 0 and busy["voc@r1"] > 0
    timeline = traceview.chrome_trace(events)["traceEvents"]
    names = {e["args"]["name"] for e in timeline if e["ph"] == "M" and e["name"].endswith("_name")}
    assert {"voc@r0", "voc@r1", "p_voc@r0", "p_voc@r1"} <= names


async def held(pipeline: ot.Pipeline, nursery: trio.Nursery, rid: str, folder: Path) -> tuple[int, int]:
    """Start ``rid`` (it blocks in its replica) and return ``(replica, pid)`` once the replica computes it."""
    start(pipeline, nursery, rid, folder)
    replica, pid = (await helpers.wait_for_file(folder / rid)).split()
    return int(replica), int(pid)


def start(pipeline: ot.Pipeline, nursery: trio.Nursery, rid: str, folder: Path) -> None:
    """Start ``rid``; its end (aborted, or failed by a dead replica) is expected."""

    async def run() -> None:
        with contextlib.suppress(ot.RequestAborted, ot.StageProcessDied):
            await pipeline.submit(rid, "x", params={"dir": str(folder)})

    nursery.start_soon(run)


@PLACEMENTS
async def test_abort_of_a_request_on_replica_1_leaves_nothing_on_either_replica(
    ipc_base: Path, omni_placement: str, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(holder_pipeline(ipc_base, omni_placement)) as pipeline:
            async with trio.open_nursery() as nursery:
                assert (await held(pipeline, nursery, "a", tmp_path))[0] == 0
                assert (await held(pipeline, nursery, "b", tmp_path))[0] == 1
                assert await pipeline.abort("b")
                stats = await pipeline.stats()
                assert stats.stages["hold@r1"].idle, stats
                assert stats.stages["hold@r0"].active_requests == 1, stats
                assert await pipeline.abort("a")
            assert (await pipeline.stats()).idle


@PLACEMENTS
async def test_a_killed_replica_fails_only_its_requests_and_comes_back(
    ipc_base: Path, omni_placement: str, tmp_path: Path
) -> None:
    # Replica 1 stays down for the backoff at least: long enough to see the pipeline degraded
    # (a worker forked from the template is ready again a few ms after the backoff).
    config = holder_pipeline(ipc_base, omni_placement, restart="on-failure", restart_backoff_s=3.0)
    died: list[ot.StageProcessDied] = []
    failed = trio.Event()
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:

            async def doomed(rid: str) -> None:
                with pytest.raises(ot.StageProcessDied) as error:
                    await pipeline.submit(rid, "x", params={"dir": str(tmp_path)})
                died.append(error.value)
                failed.set()

            assert (await held(pipeline, nursery, "a0", tmp_path))[0] == 0
            nursery.start_soon(doomed, "b1")
            replica, victim = (await helpers.wait_for_file(tmp_path / "b1")).split()
            assert replica == "1"
            assert (await held(pipeline, nursery, "a2", tmp_path))[0] == 0
            os.kill(int(victim), signal.SIGKILL)
            await failed.wait()
            assert (died[0].request_id, died[0].process, died[0].pid) == ("b1", "p_hold@r1", int(victim))
            # The requests on replica 0 are untouched; while replica 1 is down the pipeline is
            # degraded and new requests go to replica 0.
            stats = await pipeline.stats()
            assert stats.degraded and stats.down_replicas == ("p_hold@r1",), stats
            assert stats.stages["hold@r0"].active_requests == 2 and not stats.stages["hold@r1"].healthy
            params = {"dir": str(tmp_path), "block": False}
            assert await pipeline.submit("c", "x", params=params) == {"trail": ["held@r0"]}
            while (await pipeline.stats()).degraded:  # bounded by fail_after: the restart takes a moment
                await trio.sleep(0.05)
            # Back: the least loaded replica (r0 still holds a0 and a2) takes the next request.
            assert await pipeline.submit("d", "x", params=params) == {"trail": ["held@r1"]}
            pid = int((tmp_path / "d").read_text().split()[1])
            assert pid != int(victim) and pid in helpers.worker_processes()
            assert await pipeline.abort("a0") and await pipeline.abort("a2")
            assert (await pipeline.stats()).idle


async def test_a_dead_replica_without_restart_leaves_the_pipeline_serving(ipc_base: Path, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(holder_pipeline(ipc_base, "embedded")) as pipeline:
            async with trio.open_nursery() as nursery:
                _, victim = await held(pipeline, nursery, "a", tmp_path)
                os.kill(victim, signal.SIGKILL)
            stats = await pipeline.stats()
            assert stats.down_replicas == ("p_hold@r0",), stats
            params = {"dir": str(tmp_path), "block": False}
            for rid in ("b", "c"):
                assert await pipeline.submit(rid, "x", params=params) == {"trail": ["held@r1"]}
            assert (await pipeline.stats()).stages["hold@r1"].idle


# --------------------------------------------------------------------------- configuration and units


def test_replica_settings_are_validated_with_their_paths() -> None:
    with pytest.raises(ot.ConfigError) as error:
        ot.PipelineConfig(
            stages=[
                stage("a", "create_append", factory={"tag": "a"}, next="b", replicas=2),
                stage("b", "create_append", factory={"tag": "b"}, process="p", next="c", replicas=2),
                stage("c", "create_append", factory={"tag": "c"}, process="p", next="d@r1", replicas=3),
                stage("d@r1", "create_append", process="q", terminal=True, replicas=2, replica_factory=[{}]),
            ]
        )
    paths = sorted(problem.path for problem in error.value.problems)
    assert paths == [
        "stages[0].replicas",  # embedded
        "stages[2].replicas",  # differs from b's in process p
        "stages[3].name",  # looks like a replica's address
        "stages[3].replica_factory",  # one entry for two replicas
    ]


def test_per_replica_factory_kwargs_their_check_and_a_config_file(tmp_path: Path) -> None:
    voc = stage("v", "create_append", factory={"tag": "t{replica}", "n": [1, "x{replica}"]}, process="p",
                terminal=True, replicas=2, replica_factory=[{}, {"tag": "special"}])
    assert voc.factory_kwargs(0) == {"tag": "t0", "n": [1, "x0"]}
    assert voc.factory_kwargs(1) == {"tag": "special", "n": [1, "x1"]}
    config = ot.PipelineConfig(stages=[voc], replica_policy="omni_trio.coordinator.replicas.LeastInFlight")
    config.to_file(tmp_path / "replicas.toml")
    assert ot.load_config(tmp_path / "replicas.toml") == config
    bad = ot.PipelineConfig(stages=[stage("v", "create_append", factory={"tag": "t"}, process="p", terminal=True,
                                          replicas=2, replica_factory=[{}, {"tga": "x"}])])
    with pytest.raises(ot.ConfigError) as error:
        check_imports(bad)
    assert [p.path for p in error.value.problems] == ["stages[0].replica_factory[1]['tga']"]


def test_least_in_flight_breaks_ties_round_robin() -> None:
    policy = LeastInFlight()
    request = ot.OmniRequest("x", {}, {})

    def loads(*counts: int) -> list[ReplicaLoad]:
        return [ReplicaLoad(k, f"p@r{k}", n) for k, n in enumerate(counts)]

    assert [policy.choose("r", request, "p", loads(0, 0, 0)) for _ in range(4)] == [0, 1, 2, 0]
    assert policy.choose("r", request, "p", loads(3, 1, 1)) == 1
    assert policy.choose("r", request, "p", loads(3, 1, 1)) == 2
    assert policy.choose("r", request, "p", [ReplicaLoad(1, "p@r1", 5)]) == 1


def test_a_binding_lives_as_long_as_a_holder_holds_it() -> None:
    config = ot.PipelineConfig(stages=[
        stage("a", "create_append", process="pa", next="v"),
        stage("v", "create_append", process="pv", terminal=True, replicas=2),
    ])
    table = BindingTable(config)
    table.hold("r", "a")  # nothing to hold without a binding
    assert table.of("r") is None
    table.hold("r", "a", {"pv": 1})
    table.hold("r", "v")
    assert table.replica("r", "v") == 1 and table.replica_of("r", "a") is None
    assert table.needs("r", "pv@r1") and not table.needs("r", "pv@r0") and table.needs("r", "pa")
    table.release("r", "a")
    assert table.of("r") == {"pv": 1}
    table.release("r", "v")
    assert table.of("r") is None and len(table) == 0
    with pytest.raises(LookupError):
        table.replica("r", "v")


async def test_a_replicated_entry_stage_takes_turns(ipc_base: Path, tmp_path: Path) -> None:
    config = replicated(
        ipc_base,
        "embedded",
        stage("hold", "create_replica_holder", next="last", replicas=2),
        stage("last", "create_append", factory={"tag": "last"}, terminal=True),
    )
    params = {"dir": str(tmp_path), "block": False}
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            trails = [(await pipeline.submit(f"r{i}", "x", params=params))["trail"] for i in range(4)]
    assert trails == [["held@r0", "last"], ["held@r1", "last"], ["held@r0", "last"], ["held@r1", "last"]]


async def test_fan_in_inputs_of_a_request_meet_on_one_replica(ipc_base: Path) -> None:
    # A split stage fans out to two stages, whose payloads a join with 2 replicas waits for: each
    # request completes only if both of its inputs reach the same replica.
    config = replicated(
        ipc_base,
        "embedded",
        stage("split", "create_append", factory={"tag": "split"}, next=["left", "right"]),
        stage("left", "create_append", factory={"tag": "left"}, next="join"),
        stage("right", "create_append", factory={"tag": "right"}, next="join"),
        stage("join", "create_passthrough", wait_for=["left", "right"], merge_fn="tests.stages.merge_trails",
              terminal=True, replicas=2),
    )
    results: dict[str, object] = {}
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:

            async def one(rid: str) -> None:
                results[rid] = await pipeline.submit(rid, rid)

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, f"r{i}")
            stats = await pipeline.stats()
            assert stats.idle, stats
    assert results == {
        f"r{i}": {"left": [f"r{i}", "split", "left"], "right": [f"r{i}", "split", "right"]} for i in range(8)
    }


async def test_a_session_cannot_own_a_replicated_stage(ipc_base: Path, tmp_path: Path) -> None:
    # A session's state lives in one scheduler across requests; replicas are bound per request.
    config = holder_pipeline(ipc_base, "embedded")
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            with pytest.raises(ValueError, match=r"session stages \['hold'\] have replicas"):
                await pipeline.submit(
                    "s-open", None, metadata={"omni_session": {"op": "open", "session_id": "s", "stages": ["hold"]}}
                )
            assert (await pipeline.stats()).idle
