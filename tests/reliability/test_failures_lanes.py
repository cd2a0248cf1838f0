"""A slow consumer on one edge does not stall the stage's other edges.

A producer streams 24 chunks of 1 MiB (shared memory: each holds one of its edge's two credits until
the consumer's scheduler takes it) to two consumers in their own processes. ``slow`` stalls 3 s on
its first chunk; ``fast`` keeps only a checksum. Routed by one sequential drain, the producer waited
for ``slow``'s credits and ``fast`` got nothing more until the stall ended; with one send lane per
edge, ``fast`` receives every chunk (in order, checked one by one) and completes while ``slow``
still stalls, and ``slow`` then gets all of its chunks too.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.stage.edges import LANE_CHUNKS, EdgeQueues
from tests.placement import stage
from tests.process import helpers
from tests.reliability.failure_stages import M

MIB = 1 << 20
CHUNKS = 24
STALL_S = 3.0


async def test_a_stalled_consumer_does_not_stall_the_other_edge(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("producer", "create_lazy_producer", factory={"chunks": CHUNKS, "numel": MIB // 4, "max_queued": 2},
              process="p_prod", next=["slow", "fast"], stream_to=["slow", "fast"]),
        ot.StageConfig(name="slow", factory_path=f"{M}.create_warm_checksum", factory={"first_sleep_s": STALL_S},
                       process="p_slow", terminal=True, can_accept_stream_before_payload=True),
        ot.StageConfig(name="fast", factory_path=f"{M}.create_warm_checksum", process="p_fast", terminal=True,
                       can_accept_stream_before_payload=True),
    )
    done: dict[str, float] = {}
    results: dict[str, dict[str, object]] = {}
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            started = time.monotonic()
            async with pipeline.stream("r", "x") as events:
                async for event in events:
                    if isinstance(event, ot.CompleteMessage):
                        done[event.from_stage] = time.monotonic() - started
                        results[event.from_stage] = event.result
            assert (await pipeline.stats()).idle
    for name in ("slow", "fast"):
        result = results[name]
        assert result["misplaced"] is None and result["chunks"] == CHUNKS, (name, result)
        assert result["checksum"] == float(MIB // 4) * CHUNKS * (CHUNKS - 1) / 2, (name, result)
    print(f"\nFIGURES lanes: fast_done_s={done['fast']:.2f} slow_done_s={done['slow']:.2f} stall_s={STALL_S}")
    # All 24 MiB reached fast while slow was still stalled on its first chunk (both consumers imported
    # torch at start-up; the producer's own first chunk may wait for its import: compared, not timed from 0).
    assert done["slow"] - done["fast"] >= STALL_S - 1.0, done


async def test_edge_queues_keep_each_lane_in_order_and_bounded() -> None:
    """The lanes themselves: a blocked lane holds up neither another lane nor a result routed on it;
    each lane keeps its order; a full lane makes the next send wait for room."""
    sent: dict[str, list[int]] = {"slow": [], "fast": []}
    unblock = trio.Event()

    def sender(lane: str, i: int):
        async def send() -> None:
            if lane == "slow" and i == 0:
                await unblock.wait()
            sent[lane].append(i)

        return send

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            edges = EdgeQueues(nursery)
            for i in range(LANE_CHUNKS):
                await edges.send("slow", 1, sender("slow", i))
                await edges.send("fast", 1, sender("fast", i))
            await edges.reached("fast")  # a barrier on the fast lane returns while slow is blocked
            assert sent == {"slow": [], "fast": list(range(LANE_CHUNKS))}
            assert edges.queued == LANE_CHUNKS
            refused_room = trio.Event()

            async def one_more() -> None:
                await edges.send("slow", 1, sender("slow", LANE_CHUNKS))
                refused_room.set()

            nursery.start_soon(one_more)
            await trio.testing.wait_all_tasks_blocked()
            assert not refused_room.is_set()  # the slow lane is full: the send waits
            unblock.set()
            await refused_room.wait()
            await edges.flush()
            assert sent["slow"] == list(range(LANE_CHUNKS + 1)) and edges.queued == 0
            nursery.cancel_scope.cancel()


async def test_an_idle_lane_sends_from_the_callers_task_and_keeps_its_order() -> None:
    """An awaited send on an idle lane runs in the caller's task (no hand-off); what is queued on the
    lane meanwhile is sent after it, in order."""
    order: list[str] = []
    tasks: list[object] = []
    release = trio.Event()

    async def first() -> None:
        tasks.append(trio.lowlevel.current_task())
        await release.wait()
        order.append("first")

    def later(name: str):
        async def send() -> None:
            order.append(name)

        return send

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            edges = EdgeQueues(nursery)
            caller_done = trio.Event()

            async def caller() -> None:
                tasks.append(trio.lowlevel.current_task())
                await edges.call("a", first)
                caller_done.set()

            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            await edges.send("a", 1, later("chunk"))  # queued behind the running call
            await trio.testing.wait_all_tasks_blocked()
            assert order == [] and edges.queued == 1
            release.set()
            await caller_done.wait()
            await edges.reached("a")
            assert order == ["first", "chunk"]
            caller_task, sending_task = tasks
            assert sending_task is caller_task
            await edges.flush()
            nursery.cancel_scope.cancel()


async def test_fan_out_sends_every_destination_at_once_and_raises_the_error() -> None:
    """Whichever destination of a fan-out is blocked (the one sent from the caller's task or one sent
    by its lane), the others are sent meanwhile; a failing destination's error is raised."""
    for blocked in ("a", "b"):
        sent: list[str] = []
        unblock = trio.Event()

        def sender(name: str, blocked: str = blocked, sent: list[str] = sent, unblock: trio.Event = unblock):
            async def send() -> None:
                if name == blocked:
                    await unblock.wait()
                sent.append(name)

            return send

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                edges = EdgeQueues(nursery)
                done = trio.Event()

                async def fan(edges: EdgeQueues = edges, done: trio.Event = done) -> None:
                    await edges.fan_out({"a": sender("a"), "b": sender("b")})
                    done.set()

                nursery.start_soon(fan)
                await trio.testing.wait_all_tasks_blocked()
                assert sent == [name for name in ("a", "b") if name != blocked] and not done.is_set()
                unblock.set()
                await done.wait()
                assert sorted(sent) == ["a", "b"]

                async def fails() -> None:
                    raise LookupError("no route")

                with pytest.raises(LookupError, match="no route"):
                    await edges.fan_out({"a": sender("a"), "b": fails})
                with pytest.raises(LookupError, match="no route"):
                    await edges.fan_out({"a": fails, "b": sender("b")})
                await edges.flush()
                nursery.cancel_scope.cancel()
