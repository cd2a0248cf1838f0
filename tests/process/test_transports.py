"""Which transport each edge uses across processes, read back from the trace.

The chapter's experiment (examples/ch6_pipeline.py): ``src`` and ``near`` share
process ``p_main``, ``far`` runs in ``p_far``; ``src`` sends a 4 MB tensor
payload to both and streams one (small) or two (big) chunks to ``far``. In
the reference the 64 KiB chunk of the big run crashes ``src``; here it goes
through shared memory.

Also: tensors in a worker's terminal results and stream chunks reach the
caller as tensors, and lane order holds for objects read from shared memory.
"""

from __future__ import annotations

import ast
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
import trio

import omni_trio as ot
from examples import ch6_pipeline
from tests.placement import stage
from tests.process import helpers

INLINE_LIMIT = 16 * 1024
CH6_RESULTS = {
    "small": {"near": {"near_sum": 1048576}, "far": {"far_chunks": [8], "far_sum": 1048576}},
    "big": {"near": {"near_sum": 1048576}, "far": {"far_chunks": [8, 16384], "far_sum": 1048576}},
}


@attrs.frozen
class Run:
    result: Any
    events: list[dict[str, Any]]
    trace: Path

    def named(self, name: str, **fields: Any) -> list[dict[str, Any]]:
        """The events called ``name`` whose fields include ``fields``."""
        return [e for e in self.events if e["event"] == name and all(e.get(k) == v for k, v in fields.items())]

    def selected(self, stage_name: str, direction: str, peer: str) -> list[str]:
        """The transports an edge selected, in order."""
        return [e["transport"] for e in self.named("comm_transport_selected", stage=stage_name,
                                                   direction=direction, peer_stage=peer)]


@pytest.fixture(scope="module")
def ch6(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """The experiment's two runs, once for the whole module (each starts two workers)."""
    traces = tmp_path_factory.mktemp("ch6")
    ipc_base = Path(tempfile.mkdtemp(prefix="ot-ch6-", dir="/tmp"))
    runs = {}
    try:
        with helpers.nothing_left_behind(ipc_base):
            for mode in ("small", "big"):
                trace = traces / mode / "run.jsonl"
                trace.parent.mkdir()

                async def run(big: bool = mode == "big", trace: Path = trace) -> dict[str, Any]:
                    with trio.fail_after(60):
                        return await ch6_pipeline.run(big, trace, base_path=str(ipc_base))

                runs[mode] = Run(trio.run(run), ot.read_trace(trace), trace)
        yield runs
    finally:
        shutil.rmtree(ipc_base, ignore_errors=True)


MODES = ["small", "big"]


@pytest.mark.parametrize("mode", MODES)
def test_ch6_result(ch6: dict[str, Run], mode: str) -> None:
    assert ch6[mode].result == CH6_RESULTS[mode]


@pytest.mark.parametrize("mode", MODES)
def test_ch6_stream_chunks_inline_when_small_shm_when_big(ch6: dict[str, Run], mode: str) -> None:
    run = ch6[mode]
    sends = run.named("comm_stream_send", from_stage="src", to_stage="far")
    assert [(e["chunk_id"], e["transport"]) for e in sends] == [(0, "inline"), (1, "shm")][: len(sends)]
    assert len(sends) == (2 if mode == "big" else 1)
    assert sends[0]["bytes"] <= INLINE_LIMIT  # the 64-byte chunk rides inside the control message
    if mode == "big":
        assert sends[1]["bytes"] == 16384 * 4  # the 64 KiB chunk: its bytes through shared memory
        assert run.selected("src", "stream", "far") == ["inline", "shm"]
        (change,) = run.named("comm_transport_selected", stage="src", direction="stream", transport="shm")
        assert change["previous"] == "inline"
    else:
        assert run.selected("src", "stream", "far") == ["inline"]
    reads = run.named("comm_stream_read", from_stage="src", to_stage="far")
    assert [(e["chunk_id"], e["transport"], e["process"]) for e in reads] == [
        (e["chunk_id"], e["transport"], "p_far") for e in sends
    ]


@pytest.mark.parametrize("mode", MODES)
def test_ch6_same_process_payload_is_passed_as_object(ch6: dict[str, Run], mode: str) -> None:
    run = ch6[mode]
    assert run.selected("src", "payload", "near") == ["local_object"]
    assert not run.named("comm_payload_send", from_stage="src", to_stage="near")  # never serialised


@pytest.mark.parametrize("mode", MODES)
def test_ch6_cross_process_tensor_payload_goes_by_shm(ch6: dict[str, Run], mode: str) -> None:
    # Regression: the tensors of a StagePayload's data were not extracted (packing walks dicts,
    # lists and tuples only), so the 4 MB payload was pickled into the control message (inline).
    run = ch6[mode]
    assert run.selected("src", "payload", "far") == ["shm"]
    (send,) = run.named("comm_payload_send", from_stage="src", to_stage="far")
    assert send["transport"] == "shm"
    assert send["bytes"] == 1024 * 1024 * 4


def _direction(event: dict[str, Any]) -> str:
    if event["event"] == "comm_stream_send":
        return "stream"
    if event["to_stage"] == "coordinator":
        return "result"
    if event["from_stage"] == "coordinator":
        return "submit"
    return "payload"


@pytest.mark.parametrize("mode", MODES)
def test_ch6_every_edge_with_traffic_logged_its_transport(ch6: dict[str, Run], mode: str) -> None:
    run = ch6[mode]
    sends = run.named("comm_payload_send") + run.named("comm_stream_send")
    assert sends
    edges = set()
    for send in sends:
        edge = (send["from_stage"], _direction(send), send["to_stage"])
        edges.add(edge)
        # The edge's most recent choice before this send is the transport the send used.
        earlier = [e for e in run.named("comm_transport_selected", stage=edge[0], direction=edge[1],
                                        peer_stage=edge[2]) if e["ts_ns"] <= send["ts_ns"]]
        assert earlier, f"no comm_transport_selected before {send}"
        assert earlier[-1]["transport"] == send["transport"], send
        assert earlier[-1]["process"] == send["process"]
    assert edges == {
        ("coordinator", "submit", "src"),
        ("src", "payload", "far"),
        ("src", "stream", "far"),
        ("near", "result", "coordinator"),
        ("far", "result", "coordinator"),
    }
    # Each edge logs its first choice once, and again only when the choice changes.
    selected = run.named("comm_transport_selected")
    for event in selected:
        assert event["transport"] != event["previous"]
    assert len({(e["stage"], e["direction"], e["peer_stage"], e["previous"]) for e in selected}) == len(selected)


def test_ch6_summary_names_every_edge_and_chunk(ch6: dict[str, Run]) -> None:
    lines = ch6_pipeline.summarize(ch6["big"].trace)
    assert lines[0] == "  payload src → near  local_object"
    assert lines[1] == "  payload src → far   shm"
    assert lines[2] == "  stream  src → far   shm"
    assert lines[3].startswith("  流式块 ") and lines[3].endswith(" 字节 → inline")
    assert lines[4] == "  流式块 65536 字节 → shm"
    assert len(lines) == 5


async def test_ch6_command_line(tmp_path: Path) -> None:
    trace = tmp_path / "cli.jsonl"
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "examples.ch6_pipeline", "big", "--trace", str(trace)],
            capture_stdout=True,
            capture_stderr=True,
            cwd=Path(__file__).resolve().parents[2],
        )
    lines = done.stdout.decode().splitlines()
    assert lines[0].startswith("RESULT ")
    assert ast.literal_eval(lines[0].removeprefix("RESULT ")) == CH6_RESULTS["big"]
    assert "  流式块 65536 字节 → shm" in lines
    assert trace.exists()


async def test_tensor_results_and_chunks_reach_the_caller_as_tensors(ipc_base: Path, tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    config = helpers.config(ipc_base, stage("voice", "create_sized_streamer", process="p_voice", terminal=True))
    result_numel = 1 << 20  # 4 MiB of float32
    with trio.fail_after(30):
        async with ot.open_pipeline(config, trace=trace) as pipeline:
            events = []
            params = {"chunk_numels": [16, 16384], "result_numel": result_numel}
            async with pipeline.stream("r0", "speak", params=params) as stream:
                async for event in stream:
                    events.append(event)
            # Once more: segments of the first request were freed, credits returned.
            again = await pipeline.submit("r1", "speak", params={"result_numel": result_numel})
            assert (await pipeline.stats()).idle
    chunks = [e for e in events if isinstance(e, ot.StreamMessage)]
    (complete,) = [e for e in events if isinstance(e, ot.CompleteMessage)]
    assert [(c.chunk_id, c.from_stage) for c in chunks] == [(0, "voice"), (1, "voice")]
    for chunk, numel in zip(chunks, [16, 16384], strict=True):
        assert isinstance(chunk.chunk, torch.Tensor)
        assert torch.equal(chunk.chunk, torch.arange(numel, dtype=torch.float32))
    for result in (complete.result, again):
        assert set(result) == {"pcm", "n"} and result["n"] == result_numel
        assert isinstance(result["pcm"], torch.Tensor) and result["pcm"].dtype == torch.float32
        assert torch.equal(result["pcm"], torch.arange(result_numel, dtype=torch.float32))

    run = Run(None, ot.read_trace(trace), trace)
    assert run.selected("voice", "stream", "coordinator") == ["inline", "shm"]
    assert run.selected("voice", "result", "coordinator") == ["shm"]
    sends = run.named("comm_stream_send", from_stage="voice", to_stage="coordinator")
    assert [(e["chunk_id"], e["transport"]) for e in sends] == [(0, "inline"), (1, "shm")]
    assert sends[0]["bytes"] <= INLINE_LIMIT and sends[1]["bytes"] == 16384 * 4
    results = run.named("comm_payload_send", from_stage="voice", to_stage="coordinator")
    assert [(e["transport"], e["bytes"]) for e in results] == [("shm", result_numel * 4)] * 2
    reads = run.named("comm_stream_read", to_stage="coordinator")
    assert [(e["chunk_id"], e["transport"], e["process"]) for e in reads] == [(0, "inline", "main"), (1, "shm", "main")]


async def test_shm_chunk_is_delivered_before_the_done_signal_that_follows_it(ipc_base: Path) -> None:
    """Lane order holds within one receive batch: a chunk read from shared memory (in a task)
    reaches the scheduler before the stream-done signal and the inline payload that follow it.

    Regression test: with the lane claimed only when the read task started, the done signal and
    the payload overtook the chunk, which was then lost (``far_chunks == [8]``; seen once from
    ``python -m examples.ch6_pipeline big``).
    """
    from omni_trio.comm.dataref import DataRefKind
    from omni_trio.comm.segments import remove_segments
    from omni_trio.comm.shm import ShmRelay
    from omni_trio.comm.transfer import encode_object
    from omni_trio.control.wire import messages as m
    from omni_trio.control.wire.codec import encode

    config = helpers.config(
        ipc_base,
        # The upstream stays silent: the test sends what it would have sent, in one burst.
        stage("src", "create_swallow", next=["far"], stream_to=["far"]),
        ot.StageConfig(name="far", process="p_far", factory_path="examples.ch6_stages.create_far", terminal=True,
                       can_accept_stream_before_payload=True),
    )
    push: helpers.RawPush | None = None
    prefix = None
    try:
        with trio.fail_after(30):
            async with ot.open_pipeline(config) as pipeline:
                ipc = helpers.ipc_dir(ipc_base)
                prefix = f"{helpers.run_prefix(ipc)}-99"  # receivers only read segments of their run
                relay = ShmRelay(prefix)
                result: dict[str, Any] = {}

                async def submit() -> None:
                    result.update(await pipeline.submit("r0", "go"))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit)
                    request = ot.OmniRequest("go")

                    async def data_ready(obj: object, kind: DataRefKind, chunk_id: int | None) -> list[bytes]:
                        ref, _ = await encode_object(obj, relay=relay, sender="src", target="far", kind=kind,
                                                     object_id=f"r0:forged:src:far:{chunk_id}")
                        return encode(m.DataReady(request_id="r0", from_stage="src", to_stage="far",
                                                  data_ref=ref.to_wire(), chunk_id=chunk_id))

                    # A chunk message carries a list of (data, metadata) pairs, here one each.
                    burst = [
                        await data_ready([(torch.arange(8), None)], DataRefKind.stream_chunk, 0),  # inline
                        await data_ready([(torch.zeros(16384), None)], DataRefKind.stream_chunk, 1),  # shm
                        encode(m.DataReady(request_id="r0", from_stage="src", to_stage="far", is_done=True)),
                        await data_ready(ot.StagePayload("r0", request, {"features": torch.ones(4)}),
                                         DataRefKind.stage_payload, None),
                    ]
                    (worker,) = helpers.worker_processes()
                    push = helpers.RawPush(ipc / "p_far.sock")
                    # Stopped, the worker finds the whole burst queued when it resumes: one receive batch.
                    os.kill(worker, signal.SIGSTOP)
                    try:
                        auth = helpers.run_auth(ipc)  # what the upstream would have sent carries the run's proof
                        for frames in burst:
                            await push.send_multipart(auth.seal(frames))
                        await trio.sleep(0.2)
                    finally:
                        os.kill(worker, signal.SIGCONT)
                await relay.aclose()
        assert result == {"far_chunks": [8, 16384], "far_sum": 4}
    finally:
        if push is not None:
            push.close()
        if prefix is not None:
            remove_segments(prefix)


async def test_a_burst_of_small_chunks_travels_in_few_messages_in_order(ipc_base: Path, tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    numels = [8] * 150 + [16384] + [8] * 150  # one chunk in the middle needs shared memory
    config = helpers.config(
        ipc_base,
        stage("burst", "create_burst_streamer", process="p_burst", next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", process="p_sum", terminal=True, can_accept_stream_before_payload=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config, trace=trace) as pipeline:
            events = [event async for event in pipeline.stream("r0", "go", params={"numels": numels})]
            assert (await pipeline.stats()).idle
    chunks = [e for e in events if isinstance(e, ot.StreamMessage)]
    assert [c.chunk_id for c in chunks] == list(range(len(numels)))
    assert [c.chunk for c in chunks] == [float(i * n) for i, n in enumerate(numels)]
    assert events[-1].result == {"chunks": len(numels)}

    run = Run(None, ot.read_trace(trace), trace)
    for sender, receiver in (("burst", "sum"), ("sum", "coordinator")):
        sends = run.named("comm_stream_send", from_stage=sender, to_stage=receiver)
        # Every chunk sent exactly once, in order, at most 64 to a message.
        covered = [s["chunk_id"] + i for s in sends for i in range(s["chunk_count"])]
        assert covered == list(range(len(numels)))
        assert max(s["chunk_count"] for s in sends) <= 64
    # The burst was queued at once: its small chunks share messages; the big one travels alone.
    burst = run.named("comm_stream_send", from_stage="burst")
    assert len(burst) <= 16  # 301 chunks; halving around the big one costs a few more messages
    assert [(s["chunk_id"], s["chunk_count"]) for s in burst if s["transport"] == "shm"] == [(150, 1)]


async def test_the_first_chunk_leaves_alone_and_the_rest_coalesce(ipc_base: Path, tmp_path: Path) -> None:
    # The streamer's drain is idle when its first chunk is put and finds all ten queued when it runs: the
    # first goes out at once in a message of its own, the nine queued behind it share the next one.
    trace = tmp_path / "run.jsonl"
    config = helpers.config(
        ipc_base,
        stage("burst", "create_loop_burst_streamer", process="p_burst", next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", process="p_sum", terminal=True, can_accept_stream_before_payload=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config, trace=trace) as pipeline:
            events = [event async for event in pipeline.stream("r0", "go", params={"chunks": 10})]
    assert [e.chunk for e in events if isinstance(e, ot.StreamMessage)] == [float(8 * i) for i in range(10)]
    sends = Run(None, ot.read_trace(trace), trace).named("comm_stream_send", from_stage="burst")
    assert [(s["chunk_id"], s["chunk_count"]) for s in sends] == [(0, 1), (1, 9)]


async def test_a_burst_of_shared_memory_chunks_flows_on_two_credits(ipc_base: Path) -> None:
    # Ten chunks of 256 KiB queued at once, two credits to the consumer: the drain sends each chunk's
    # message at once (it waits for the credit an earlier chunk's ACK returns; a held message would
    # never be ACKed, and the stream would stall until the ACK timeout, 30 s).
    numel = 64 * 1024
    config = helpers.config(
        ipc_base,
        stage("burst", "create_loop_burst_streamer", process="p_burst", next="sum", stream_to=["sum"]),
        stage("sum", "create_streaming_sum", process="p_sum", terminal=True, can_accept_stream_before_payload=True),
    )
    with trio.fail_after(20):
        async with ot.open_pipeline(config) as pipeline:
            events = [event async for event in pipeline.stream("r0", "go", params={"chunks": 10, "numel": numel})]
    assert [e.chunk for e in events if isinstance(e, ot.StreamMessage)] == [float(numel * i) for i in range(10)]
