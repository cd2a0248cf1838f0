"""The ``ray`` launcher (issue #16): workers in Ray actors on a two-node cluster on this machine.

One cluster for the module (``ray.cluster_utils.Cluster``; each node has a custom resource naming it).
Ray groups are never assumed to share a host, so the edges to them are TCP although the two nodes
share /dev/shm here.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.tracing.trace import read_trace

ray = pytest.importorskip("ray", reason="the ray launcher's tests need Ray: pip install 'omni-trio[ray]'")
from ray.cluster_utils import Cluster  # noqa: E402

M = "tests.crosshost_stages"


def _worker_dirs() -> set[Path]:
    """The private directories of joined workers (a killed one cannot remove its own)."""
    temp = Path(tempfile.gettempdir())
    return {path for process in ("p_a-", "p_b-", "p_rep@") for path in temp.glob(f"omnitrio-{process}*")}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    before = _worker_dirs()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    try:
        nodes.add_node(num_cpus=1, resources={"node_b": 1})
        nodes.wait_for_nodes()
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()
        for path in _worker_dirs() - before:
            shutil.rmtree(path, ignore_errors=True)


def _config(address: str, **restart_a: Any) -> ot.PipelineConfig:
    """``make`` -> ``a`` (on node_a; ``restart_a``: its restart settings) and ``b`` (node_b) -> ``join``;
    only ``a`` holds a request with the ``block`` param."""

    def scaled(name: str, factor: float, **more: Any) -> ot.StageConfig:
        return ot.StageConfig(name=name, process=f"p_{name}", factory_path=f"{M}.create_scale",
                              factory={"factor": factor, "ray_node": True, "blocks": name == "a"}, next="join",
                              **more)

    return ot.PipelineConfig(
        entry_stage="make",
        stages=[
            ot.StageConfig(name="make", factory_path=f"{M}.create_make", next=["a", "b"]),
            scaled("a", 2.0, **restart_a),
            scaled("b", 3.0),
            ot.StageConfig(name="join", factory_path=f"{M}.create_join", wait_for=["a", "b"], merge_fn=f"{M}.merge",
                           terminal=True),
        ],
        processes={
            "main": ot.ProcessConfig(host="127.0.0.1"),
            "p_a": ot.ProcessConfig(launcher="ray", resources={"node_a": 0.5}, ray_address=address),
            "p_b": ot.ProcessConfig(launcher="ray", resources={"node_b": 0.5}, ray_address=address),
        },
    )


async def test_stages_land_on_the_node_their_resources_name(cluster: Any, tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    n = 1 << 18
    with trio.fail_after(120):
        async with ot.open_pipeline(_config(cluster.address), trace=trace, start_timeout=90) as pipeline:
            result = await pipeline.submit("r0", "x", params={"numel": n})
    head = cluster.head_node.node_id
    (other,) = [node.node_id for node in cluster.list_all_nodes() if node.node_id != head]
    assert (result["a"]["node"], result["b"]["node"]) == (head, other)  # node_a is the head's resource
    total = n * (n - 1) / 2
    assert (result["a"]["sum"], result["b"]["sum"]) == (2 * total, 3 * total)
    sends = [e for e in read_trace(trace) if e.get("event") == "comm_payload_send"]
    edges = {(e["from_stage"], e["to_stage"]): e["transport"] for e in sends}
    assert edges == {("make", "a"): "tcp", ("a", "join"): "tcp", ("make", "b"): "tcp", ("b", "join"): "tcp"}


async def test_a_dead_actor_fails_its_requests_within_a_second(cluster: Any) -> None:
    with trio.fail_after(120), pytest.raises(ot.StageProcessDied):  # the pipeline ends with its worker
        async with ot.open_pipeline(_config(cluster.address), start_timeout=90) as pipeline:
            first = await pipeline.submit("r0", "x", params={"numel": 4})
            failed: list[tuple[BaseException, float]] = []

            async def held() -> None:
                try:
                    await pipeline.submit("r1", "x", params={"numel": 4, "block": True})
                except ot.RequestError as exc:
                    failed.append((exc, time.monotonic()))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await trio.testing.wait_all_tasks_blocked()  # r1 is out, waiting for its result
                killed_at = time.monotonic()
                os.kill(first["a"]["pid"], signal.SIGKILL)
    [(error, at)] = failed
    assert isinstance(error, ot.StageProcessDied) and error.process == "p_a"
    assert at - killed_at < 1.0


async def test_a_dead_actor_is_restarted_on_the_same_resources_and_serves_again(cluster: Any) -> None:
    # The 1 s backoff keeps the restart going through the stats call below.
    config = _config(cluster.address, restart="on-failure", max_restarts=1, restart_backoff_s=1.0)
    head = cluster.head_node.node_id
    with trio.fail_after(150):
        async with ot.open_pipeline(config, start_timeout=90) as pipeline:
            first = await pipeline.submit("r0", "x", params={"numel": 4})
            failed: list[BaseException] = []

            async def held() -> None:
                with pytest.raises(ot.StageProcessDied) as died:
                    await pipeline.submit("r1", "x", params={"numel": 4, "block": True})
                failed.append(died.value)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await trio.testing.wait_all_tasks_blocked()
                os.kill(first["a"]["pid"], signal.SIGKILL)  # the actor's worker process
            [error] = failed
            assert isinstance(error, ot.StageProcessDied) and error.process == "p_a"
            assert pipeline.health().processes["p_a"] == "restarting"
            restarting = await pipeline.stats()
            assert restarting.stages["a"].restarting and not restarting.stages["b"].restarting, restarting
            # Waits for the new actor (it joins as a new incarnation), then runs on it, on node_a again.
            n = 1 << 16
            second = await pipeline.submit("r2", "x", params={"numel": n})
            assert second["a"]["pid"] != first["a"]["pid"] and second["a"]["node"] == head
            assert second["b"]["pid"] == first["b"]["pid"]  # p_b was not restarted
            total = n * (n - 1) / 2
            assert (second["a"]["sum"], second["b"]["sum"]) == (2 * total, 3 * total)
            stats = await pipeline.stats()
            assert stats.idle and pipeline.health().processes["p_a"] == "ready", stats


def _replicated(address: str) -> ot.PipelineConfig:
    """``make`` -> ``where`` in a ``ray`` group of 2 replicas of half a CPU each (each node has one: they
    would both fit on the head; restarted on failure, the 1 s backoff keeps a killed replica down for a
    moment)."""
    return ot.PipelineConfig(
        entry_stage="make",
        stages=[
            ot.StageConfig(name="make", factory_path=f"{M}.create_make", next="where"),
            ot.StageConfig(name="where", process="p_rep", factory_path=f"{M}.create_where",
                           factory={"ray_node": True}, terminal=True, replicas=2),
        ],
        processes={
            "main": ot.ProcessConfig(host="127.0.0.1"),
            "p_rep": ot.ProcessConfig(launcher="ray", resources={"CPU": 0.5}, ray_address=address,
                                      restart="on-failure", max_restarts=1, restart_backoff_s=1.0),
        },
    )


async def test_replicas_spread_over_the_nodes_and_a_killed_one_fails_only_its_requests(cluster: Any) -> None:
    nodes = {node.node_id for node in cluster.list_all_nodes()}
    with trio.fail_after(150):
        async with ot.open_pipeline(_replicated(cluster.address), start_timeout=90) as pipeline:
            served: list[dict[str, Any]] = []

            async def one(rid: str, **params: Any) -> None:
                served.append(await pipeline.submit(rid, "x", params={"numel": 4, **params}))

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, f"r{i}")
            # One actor per replica, one replica per node (their placement group's SPREAD strategy: both
            # would fit on the head), and least-in-flight gave both replicas work.
            actors = {result["replica"]: (result["actor"], result["node"], result["pid"]) for result in served}
            assert sorted(actors) == [0, 1] and {node for _, node, _ in actors.values()} == nodes, actors
            assert "p_rep@r1" in actors[1][0] and "p_rep@r0" in actors[0][0]
            assert min(sum(result["replica"] == k for result in served) for k in (0, 1)) >= 2, served
            stats = await pipeline.stats()
            assert {"where@r0", "where@r1"} <= set(stats.stages) and stats.idle, stats
            assert {"p_rep@r0", "p_rep@r1"} <= set(pipeline.health().processes)

            # One held request per replica (least in flight); then replica 1's actor is killed.
            outcomes: dict[str, BaseException] = {}
            died = trio.Event()

            async def held(rid: str) -> None:
                try:
                    await pipeline.submit(rid, "x", params={"numel": 4, "block": True})
                except (ot.StageProcessDied, ot.RequestAborted) as exc:
                    outcomes[rid] = exc
                    if isinstance(exc, ot.StageProcessDied):
                        died.set()

            async with trio.open_nursery() as nursery:
                for rid in ("h0", "h1"):
                    nursery.start_soon(held, rid)
                    await trio.testing.wait_all_tasks_blocked()  # bound before the next one
                ray.kill(ray.get_actor(actors[1][0]), no_restart=True)
                await died.wait()
                [(doomed, error)] = outcomes.items()
                assert isinstance(error, ot.StageProcessDied) and error.process == "p_rep@r1", error
                kept = next(rid for rid in ("h0", "h1") if rid != doomed)
                # Replica 0 keeps serving (and holding its request) while replica 1 is restarted.
                stats = await pipeline.stats()
                assert stats.down_replicas == ("p_rep@r1",) and stats.stages["where@r0"].active_requests == 1
                assert pipeline.health().processes["p_rep@r1"] == "restarting"
                for i in range(3):
                    result = await pipeline.submit(f"c{i}", "x", params={"numel": 4})
                    assert (result["replica"], result["pid"]) == (0, actors[0][2])
                while (await pipeline.stats()).degraded:  # bounded by fail_after: the new actor joins
                    await trio.sleep(0.05)
                # Back, as a new actor in its replica's bundle (the same node): the least loaded replica
                # (r0 still holds one) takes the next request.
                back = await pipeline.submit("d", "x", params={"numel": 4})
                assert back["replica"] == 1 and back["actor"] != actors[1][0] and back["pid"] != actors[1][2]
                assert back["node"] == actors[1][1] and pipeline.health().ok
                assert await pipeline.abort(kept)
            assert isinstance(outcomes[kept], ot.RequestAborted)
            assert (await pipeline.stats()).idle
