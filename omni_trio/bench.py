"""The omni-trio benchmark suite: latency, throughput, transfer and idle cost of real pipelines.

Run ``python -m omni_trio.bench [--quick] [--json PATH] [--only W1,W4,...]`` (or ``omni-trio bench ...``).
Every stage runs in a worker process of its own unless a workload says otherwise. The workloads:

- ``W1``: a chain of 2 no-op stages, sequential requests after a warm-up: p50/p90/p99 latency (ms).
- ``W2``: the same with 4 stages.
- ``W3``: the 4-stage chain with 64 requests in flight: requests/s.
- ``W4``: a float32 tensor (4 MB and 64 MB) from a source stage to a sink stage in another process:
  MB/s and latency (median), next to the single-process cost of ``copy_`` into a preallocated
  buffer and of ``clone()``; the ``empty_`` metrics are the same with a source that builds its
  output with ``ot.empty`` (the opt-in zero-copy path, an extra column).
- ``W5``: a talker streams small int64 chunks to a streaming vocoder in another process that
  forwards each one to the caller: chunks/s and time to first chunk.
- ``W6``: split -> (upper, count) -> join, a process each: latency.
- ``W7``: the 4-stage chain with every stage in one worker process: latency.
- ``W8``: start-up and shutdown time of the 4-stage chain.
- ``W9``: a chain whose middle stage holds each request 20 ms outside the GIL, 16 in flight, with that
  stage's replicas at 1, 2 and 4: requests/s and speed-ups (:mod:`omni_trio.bench_replicas`).
- ``floor``: a raw pyzmq PUSH/PULL round trip between two processes (no omni-trio).
- ``idle``: CPU used by a started, idle 4-stage pipeline (caller and workers), as % of one core.
- ``W1-tcp``, ``W4-tcp``, ``W5-tcp``: W1, W4 and W5 with a ``manual`` worker in a second network
  namespace, over CURVE TCP on a veth pair (:mod:`omni_trio.bench_tcp`; root and ``ip netns`` needed,
  else skipped with the reason); ``--only tcp`` runs the three.
- ``serve``: the omni_speech demo (one worker process per model, 24 tokens = 1.92 s of audio) behind
  ``ot.serve``: time to first audio and request latency (medians) over HTTP (httpx, streaming
  ``/v1/audio/speech``) and through ``pipeline.stream`` directly, with 1 and 8 concurrent clients.
  Needs the repository root on ``sys.path`` (the demo lives in ``examples/``) and httpx (a test extra).

``--quick`` shrinks every count so that the whole suite runs in well under a minute. The stages are
what a user writes: ``SimpleScheduler(fn)`` with its default arguments (``fn`` runs on the scheduler
thread), in a module that imports torch at the top. ``--inline`` runs the no-op and text stages'
compute on their stage's event loop instead (``SimpleScheduler(fn, inline=True)``: an extra column
of docs/benchmarks.md, not the headline). The results are printed as a table and written as JSON
(default ``out/bench.json``); ``--vs-sglang-omni`` adds SGLang-Omni's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import torch
import trio

from omni_trio import bench_replicas as replica_bench
from omni_trio.bench_measure import copy_costs, descendant_pids, percentiles_ms, proc_cpu_ticks
from omni_trio.comm.alloc import empty
from omni_trio.config import PipelineConfig, StageConfig
from omni_trio.coordinator import Coordinator
from omni_trio.events import StreamMessage
from omni_trio.payload import StagePayload
from omni_trio.runtime.pipeline import open_pipeline
from omni_trio.scheduling import IncomingMessage, Outbox, OutgoingMessage, SimpleScheduler, StreamingSimpleScheduler

M = "omni_trio.bench"
MB = 1 << 20
WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "floor", "idle", "serve",
             "W1-tcp", "W4-tcp", "W5-tcp")
#: ``--only`` names that stand for several workloads.
GROUPS = {"tcp": ("W1-tcp", "W4-tcp", "W5-tcp")}


# --------------------------------------------------------------------------- stage factories (imported by workers)


def create_noop(inline: bool = False) -> SimpleScheduler:
    """A stage that returns each payload unchanged (on the scheduler thread; on the event loop if ``inline``)."""
    return SimpleScheduler(lambda payload: payload, inline=inline)


def create_tensor_source() -> SimpleScheduler:
    """Returns ``{"t": <float32 tensor>}`` of the request's ``numel`` param; the tensor is made once per
    size and reused, so the measured time is the transfer, not the allocation."""

    cache: dict[int, Any] = {}

    def fn(payload: StagePayload) -> StagePayload:
        numel = int(payload.request.params["numel"])
        if numel not in cache:
            cache.clear()
            cache[numel] = torch.ones(numel, dtype=torch.float32)
        payload.data = {"t": cache[numel]}
        return payload

    return SimpleScheduler(fn)


def create_empty_tensor_source() -> SimpleScheduler:
    """Like :func:`create_tensor_source`, but each request's tensor is a fresh ``ot.empty`` (a slot of the
    stage's shared-memory pool, sent by reference); only its last element is written (the sink reads it):
    neither source computes its data, so both columns measure the transfer."""

    def fn(payload: StagePayload) -> StagePayload:
        t = empty(int(payload.request.params["numel"]), dtype=torch.float32)
        t[-1] = 1.0
        payload.data = {"t": t}
        return payload

    return SimpleScheduler(fn)


def create_tensor_sink() -> SimpleScheduler:
    """Takes ``{"t": tensor}`` and returns a small result: its element count and last element."""

    def fn(payload: StagePayload) -> StagePayload:
        t = payload.data["t"]
        payload.data = {"numel": int(t.numel()), "last": float(t[-1])}
        return payload

    return SimpleScheduler(fn)


class ChunkTalker:
    """A talker: for each request, pushes ``chunks`` (request param) int64 tensors of 8 elements as
    stream output, then its payload as the result. Blocks on its inbox (no polling)."""

    def __init__(self, chunks: int) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox = Outbox()
        self.chunks = chunks

    def warm_up_serving_thread(self) -> None:
        """Nothing to warm up."""

    def start(self) -> None:
        """Serve requests until the wakeup sentinel."""

        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type != "new_request":
                continue
            payload: StagePayload = msg.data
            for step in range(int(payload.request.params.get("chunks", self.chunks))):
                codes = torch.arange(step * 8, step * 8 + 8, dtype=torch.int64)
                self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=codes))
            payload.data = {"chunks": int(payload.request.params.get("chunks", self.chunks))}
            self.outbox.put(OutgoingMessage(msg.request_id, "result", data=payload))

    def stop(self) -> None:
        """Wake the serving loop so that it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Requests finish on their own; nothing to drop."""


def create_chunk_talker(chunks: int = 1000) -> ChunkTalker:
    """A :class:`ChunkTalker`."""
    return ChunkTalker(chunks)


class ForwardingVocoder(StreamingSimpleScheduler):
    """A streaming vocoder that forwards every chunk it receives to the caller unchanged."""

    def __init__(self) -> None:
        super().__init__(compute_fn=None)
        self.counts: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        """Every request streams."""
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        """Forward the chunk."""
        self.counts[request_id] = self.counts.get(request_id, 0) + 1
        return [OutgoingMessage(request_id, "stream", data=item.data, metadata={"modality": "codes"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        """Complete with the number of chunks forwarded."""
        payload = self.stream_payloads[request_id]
        payload.data = {"forwarded": self.counts.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        """Forget an aborted request's count."""
        self.counts.pop(request_id, None)


def create_forwarding_vocoder() -> ForwardingVocoder:
    """A :class:`ForwardingVocoder`."""
    return ForwardingVocoder()


def create_split(inline: bool = False) -> SimpleScheduler:
    """Splits the input text into words."""

    def fn(payload: StagePayload) -> StagePayload:
        text = payload.data["raw_inputs"]
        payload.data = {"text": text, "words": text.split()}
        return payload

    return SimpleScheduler(fn, inline=inline)


def create_upper(inline: bool = False) -> SimpleScheduler:
    """Upper-cases the text."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"upper": payload.data["text"].upper()}
        return payload

    return SimpleScheduler(fn, inline=inline)


def create_count(inline: bool = False) -> SimpleScheduler:
    """Counts the words."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"count": len(payload.data["words"])}
        return payload

    return SimpleScheduler(fn, inline=inline)


def merge(inputs: dict[str, StagePayload]) -> StagePayload:
    """Fan-in: merge the payloads of ``upper`` and ``count`` (in name order)."""
    first = next(iter(inputs.values()))
    data: dict[str, Any] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data.update(inputs[name].data)
    return StagePayload(first.request_id, first.request, data)


# --------------------------------------------------------------------------- configs

#: Factory arguments of the no-op and text stages (W1-W3, W6-W8): none (SimpleScheduler's defaults:
#: compute on the scheduler thread), or ``{"inline": True}`` with ``--inline``.
STAGE_FACTORY: dict[str, Any] = {}


def chain_config(stages: int, *, one_process: bool = False) -> PipelineConfig:
    """A chain of ``stages`` no-op stages, each in its own worker process (or all in one)."""
    names = [f"s{i}" for i in range(stages)]
    return PipelineConfig(
        name=f"bench-chain{stages}",
        entry_stage=names[0],
        stages=[
            StageConfig(
                name=name,
                process="p_all" if one_process else f"p_{name}",
                factory_path=f"{M}.create_noop",
                factory=dict(STAGE_FACTORY),
                next=names[i + 1] if i + 1 < stages else None,
                terminal=i + 1 == stages,
            )
            for i, name in enumerate(names)
        ],
    )


def tensor_config(source: str = "create_tensor_source") -> PipelineConfig:
    """source -> sink, two worker processes (``source``: the source's factory in this module)."""
    return PipelineConfig(
        name="bench-tensor",
        entry_stage="source",
        stages=[
            StageConfig(name="source", process="p_source", factory_path=f"{M}.{source}", next="sink"),
            StageConfig(name="sink", process="p_sink", factory_path=f"{M}.create_tensor_sink", terminal=True),
        ],
    )


def stream_config(chunks: int) -> PipelineConfig:
    """talker =stream=> vocoder -> caller, two worker processes."""
    return PipelineConfig(
        name="bench-stream",
        entry_stage="talker",
        stages=[
            StageConfig(name="talker", process="p_talker", factory_path=f"{M}.create_chunk_talker",
                        factory={"chunks": chunks}, next="vocoder", stream_to=["vocoder"]),
            StageConfig(name="vocoder", process="p_vocoder", factory_path=f"{M}.create_forwarding_vocoder",
                        terminal=True, can_accept_stream_before_payload=True),
        ],
    )


def fanin_config() -> PipelineConfig:
    """split -> (upper, count) -> join, a worker process each."""
    return PipelineConfig(
        name="bench-fanin",
        entry_stage="split",
        stages=[
            StageConfig(name="split", process="p_split", factory_path=f"{M}.create_split", factory=dict(STAGE_FACTORY),
                        next=["upper", "count"]),
            StageConfig(name="upper", process="p_upper", factory_path=f"{M}.create_upper", factory=dict(STAGE_FACTORY),
                        next="join"),
            StageConfig(name="count", process="p_count", factory_path=f"{M}.create_count", factory=dict(STAGE_FACTORY),
                        next="join"),
            StageConfig(name="join", process="p_join", factory_path=f"{M}.create_noop", factory=dict(STAGE_FACTORY),
                        wait_for=["upper", "count"], merge_fn=f"{M}.merge", terminal=True),
        ],
    )


# --------------------------------------------------------------------------- measurement helpers


async def sequential_latency(config: PipelineConfig, requests: int, warmup: int, inputs: Any = "x") -> dict[str, float]:
    """Open ``config``, run ``warmup`` then ``requests`` requests one after another; latency percentiles."""
    samples: list[float] = []
    async with open_pipeline(config) as pipeline:
        for i in range(warmup):
            await pipeline.submit(f"warm-{i}", inputs)
        for i in range(requests):
            started = time.perf_counter()
            await pipeline.submit(f"r-{i}", inputs)
            samples.append(time.perf_counter() - started)
    return percentiles_ms(samples)






# --------------------------------------------------------------------------- workloads


async def w1(q: bool, config: PipelineConfig | None = None) -> dict[str, float]:
    """Chain of 2 no-op stages, sequential requests (``config``: placed otherwise, omni_trio/bench_tcp.py)."""
    return await sequential_latency(config or chain_config(2), 20 if q else 500, 5 if q else 50)


async def w2(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, sequential requests."""
    return await sequential_latency(chain_config(4), 20 if q else 500, 5 if q else 50)


async def w3(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, many requests in flight: throughput."""
    total, in_flight = (200, 16) if q else (2000, 64)
    async with open_pipeline(chain_config(4)) as pipeline:
        elapsed = await concurrent_run(pipeline, total, in_flight, warmup=10)
    return {"requests_per_s": total / elapsed, "requests": float(total), "in_flight": float(in_flight),
            "elapsed_s": elapsed}


async def concurrent_run(pipeline: Coordinator, total: int, in_flight: int, *, warmup: int) -> float:
    """Seconds to run ``total`` requests with ``in_flight`` of them at a time, after ``warmup`` sequential ones."""
    for i in range(warmup):
        await pipeline.submit(f"warm-{i}", "x")
    next_id = 0

    async def client() -> None:
        nonlocal next_id
        while next_id < total:
            rid = next_id
            next_id += 1
            await pipeline.submit(f"r-{rid}", "x")

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(client)
    return time.perf_counter() - started


async def w9(q: bool) -> dict[str, float]:
    """A chain with a 20 ms device stage at 1, 2 and 4 replicas, 16 in flight: requests/s and speed-ups."""
    total = 64 if q else 400
    result: dict[str, float] = {"device_ms": replica_bench.DEVICE_S * 1000, "in_flight": float(replica_bench.IN_FLIGHT)}
    for replicas in replica_bench.REPLICAS:
        async with open_pipeline(replica_bench.replica_chain(replicas)) as pipeline:
            elapsed = await concurrent_run(pipeline, total, replica_bench.IN_FLIGHT, warmup=2 * replicas)
        result[f"requests_per_s_r{replicas}"] = total / elapsed
    for replicas in replica_bench.REPLICAS[1:]:
        result[f"speedup_r{replicas}"] = result[f"requests_per_s_r{replicas}"] / result["requests_per_s_r1"]
    return result


async def _w4_latencies(config: PipelineConfig, sizes_mb: list[int], runs: int) -> dict[int, float]:
    """Median seconds per request of each size through ``config`` (a :func:`tensor_config`)."""
    latencies: dict[int, float] = {}
    async with open_pipeline(config) as pipeline:
        for size in sizes_mb:
            numel = size * MB // 4
            await pipeline.submit(f"warm-{size}", "x", params={"numel": numel})
            samples = []
            for i in range(runs):
                started = time.perf_counter()
                out = await pipeline.submit(f"r-{size}-{i}", "x", params={"numel": numel})
                samples.append(time.perf_counter() - started)
                if out["numel"] != numel or out["last"] != 1.0:
                    raise RuntimeError(f"sink saw {out}, expected {numel} elements ending in 1.0")
            latencies[size] = statistics.median(samples)
    return latencies


async def w4(q: bool, config: PipelineConfig | None = None) -> dict[str, float]:
    """A float32 tensor from a source process to a sink process; compared with in-process copies.

    The headline is default stage code (the source returns a tensor it made); the ``empty_`` metrics
    are the opt-in fast path, a source that builds its output with ``ot.empty`` (sent by reference).
    With ``config`` (the TCP rows: the sink on another host, no shared slot to build in) only the
    headline is measured, through that config.
    """
    sizes_mb = [1] if q else [4, 64]
    runs = 3 if q else 7
    default = await _w4_latencies(config or tensor_config("create_tensor_source"), sizes_mb, runs)
    fast = None
    if config is None:
        fast = await _w4_latencies(tensor_config("create_empty_tensor_source"), sizes_mb, runs)
    result: dict[str, float] = {}
    for size in sizes_mb:
        latency = default[size]
        copy_s, clone_s = copy_costs(size * MB // 4, max(runs, 5))
        result[f"{size}MB_latency_ms"] = latency * 1000
        result[f"{size}MB_MB_per_s"] = size / latency
        result[f"{size}MB_copy_ms"] = copy_s * 1000
        result[f"{size}MB_clone_ms"] = clone_s * 1000
        result[f"{size}MB_ratio_vs_copy"] = latency / copy_s
        result[f"{size}MB_ratio_vs_clone"] = latency / clone_s
        if fast is not None:
            result[f"{size}MB_empty_latency_ms"] = fast[size] * 1000
            result[f"{size}MB_empty_MB_per_s"] = size / fast[size]
            result[f"{size}MB_empty_ratio_vs_copy"] = fast[size] / copy_s
    return result


async def w5(q: bool, config: PipelineConfig | None = None) -> dict[str, float]:
    """A talker streams small chunks to a forwarding vocoder in another process, which forwards them."""
    chunks = 50 if q else 1000
    runs = 2 if q else 5
    rates, firsts = [], []
    async with open_pipeline(config or stream_config(chunks)) as pipeline:
        for i in range(-1, runs):  # run -1 is a warm-up
            received = 0
            first = None
            started = time.perf_counter()
            async with pipeline.stream(f"r-{i}", "x", params={"chunks": chunks}) as events:
                async for event in events:
                    if isinstance(event, StreamMessage):
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


async def w6(q: bool) -> dict[str, float]:
    """Fan-out and fan-in across four processes."""
    return await sequential_latency(fanin_config(), 20 if q else 500, 5 if q else 50, inputs="hello omni trio world")


async def w7(q: bool) -> dict[str, float]:
    """The 4-stage chain with every stage in one worker process."""
    return await sequential_latency(chain_config(4, one_process=True), 20 if q else 500, 5 if q else 50)


async def w8(q: bool) -> dict[str, float]:
    """Start-up (``open_pipeline`` until ready) and shutdown (until closed) of the 4-stage chain."""
    runs = 1 if q else 5
    starts, stops = [], []
    for i in range(runs):
        started = time.perf_counter()
        async with open_pipeline(chain_config(4)) as pipeline:
            ready = time.perf_counter()
            await pipeline.submit(f"check-{i}", "x")  # outside both timings
            closing = time.perf_counter()
        stops.append(time.perf_counter() - closing)
        starts.append(ready - started)
    return {"startup_ms": statistics.median(starts) * 1000, "shutdown_ms": statistics.median(stops) * 1000,
            "runs": float(runs)}


async def idle(q: bool) -> dict[str, float]:
    """CPU of a started, idle 4-stage pipeline: the caller and its worker processes."""
    seconds = 0.5 if q else 3.0
    async with open_pipeline(chain_config(4)) as pipeline:
        await pipeline.submit("warm", "x")
        await trio.sleep(0.2)
        pids = [os.getpid(), *descendant_pids(os.getpid())]
        before = {pid: proc_cpu_ticks(pid) for pid in pids}
        started = time.perf_counter()
        await trio.sleep(seconds)
        after = {pid: proc_cpu_ticks(pid) for pid in pids}
        elapsed = time.perf_counter() - started
    ticks = sum(after[pid] - before[pid] for pid in pids)
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    return {"cpu_percent_of_core": 100 * cpu_s / elapsed, "processes": float(len(pids)), "seconds": elapsed,
            "cpu_ticks": float(ticks)}


async def _speak_direct(pipeline: Any, request_id: str) -> tuple[float, float]:
    started = time.perf_counter()
    first = math.nan
    async with pipeline.stream(request_id, "hello from the bench", params={"max_new_tokens": 24}) as events:
        async for event in events:
            if isinstance(event, StreamMessage) and math.isnan(first):
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


async def _speak_http(client: Any, model: str) -> tuple[float, float]:
    started = time.perf_counter()
    first = math.nan
    # The demo's default voice: an unknown one is a 400 naming ``voice``.
    voice = importlib.import_module("examples.omni_speech.models").DEFAULT_VOICE
    body = {"model": model, "input": "hello from the bench", "voice": voice, "response_format": "pcm"}
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        async for chunk in response.aiter_raw():
            if chunk and math.isnan(first):
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


async def serve_bench(q: bool) -> dict[str, float]:
    """The demo pipeline over HTTP against the same pipeline called directly, 1 and 8 clients at once."""
    import attrs
    import httpx

    from omni_trio.config import ServeConfig
    from omni_trio.serve import serve

    make_config = importlib.import_module("examples.omni_speech.pipeline").make_config
    model = "omni-speech-bench"
    config = attrs.evolve(make_config("processes"), serve=ServeConfig(
        model=model, adapter="examples.omni_speech.serve.SpeechAdapter", adapter_options={"max_new_tokens": 24}))
    rounds = {1: 2 if q else 10, 8: 1 if q else 3}
    samples: dict[str, list[tuple[float, float]]] = {}
    async with open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
        address = await nursery.start(serve, pipeline, config, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=address.url, timeout=120,
                                     limits=httpx.Limits(max_connections=16)) as client:
            await _speak_direct(pipeline, "warm-direct")
            await _speak_http(client, model)
            for clients, count in rounds.items():
                for r in range(count):  # alternate the two ways, so that drift hits both
                    for way in ("direct", "http"):
                        got = samples.setdefault(f"{way}_c{clients}", [])

                        async def one(i: int, way: str = way, got: list[tuple[float, float]] = got,
                                      r: int = r, clients: int = clients) -> None:
                            if way == "direct":
                                got.append(await _speak_direct(pipeline, f"b-{clients}-{r}-{i}"))
                            else:
                                got.append(await _speak_http(client, model))

                        async with trio.open_nursery() as batch:
                            for i in range(clients):
                                batch.start_soon(one, i)
        nursery.cancel_scope.cancel()
    result: dict[str, float] = {}
    for key, values in samples.items():
        result[f"{key}_first_audio_ms"] = statistics.median(v[0] for v in values) * 1000
        result[f"{key}_latency_ms"] = statistics.median(v[1] for v in values) * 1000
    for clients in rounds:
        for metric in ("first_audio_ms", "latency_ms"):
            result[f"c{clients}_{metric.removesuffix('_ms')}_http_over_direct"] = (
                result[f"http_c{clients}_{metric}"] / result[f"direct_c{clients}_{metric}"]
            )
    return result


def _zmq_echo(pull_addr: str, push_addr: str, count: int) -> None:
    """The far side of ``floor``: PULL a message, PUSH it back, ``count`` times."""
    import zmq

    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.connect(pull_addr)
    push = context.socket(zmq.PUSH)
    push.connect(push_addr)
    for _ in range(count):
        push.send(pull.recv())
    pull.close(linger=0)
    push.close(linger=1000)
    context.term()


def floor_sync(q: bool) -> dict[str, float]:
    """A raw pyzmq PUSH/PULL round trip (ipc) between this process and a child: the transport's floor."""
    import zmq

    warmup, count = (50, 200) if q else (500, 5000)
    with tempfile.TemporaryDirectory(prefix="omnitrio-bench-") as tmp:
        out_addr, back_addr = f"ipc://{tmp}/out", f"ipc://{tmp}/back"
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.bind(out_addr)
        pull = context.socket(zmq.PULL)
        pull.bind(back_addr)
        # By module path, so that the spawned child imports it even when this file runs as __main__.
        echo = importlib.import_module(M)._zmq_echo
        child = multiprocessing.get_context("spawn").Process(target=echo, args=(out_addr, back_addr, warmup + count))
        child.start()
        try:
            message = b"x" * 8
            samples = []
            for i in range(warmup + count):
                started = time.perf_counter()
                push.send(message)
                pull.recv()
                if i >= warmup:
                    samples.append(time.perf_counter() - started)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
            push.close(linger=0)
            pull.close(linger=0)
            context.term()
    ordered = sorted(samples)
    return {"p50_us": statistics.median(ordered) * 1e6, "p99_us": ordered[int(0.99 * (len(ordered) - 1))] * 1e6,
            "n": float(len(ordered))}


ASYNC_WORKLOADS: dict[str, Callable[[bool], Awaitable[dict[str, float]]]] = {
    "W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, "W7": w7, "W8": w8, "W9": w9, "idle": idle,
    "serve": serve_bench,
}


def run_workload(name: str, quick: bool) -> dict[str, float]:
    """Run one workload (a fresh ``trio.run`` each) and return its metrics."""
    if name == "floor":
        return floor_sync(quick)
    if name.endswith("-tcp"):
        from omni_trio import bench_tcp  # it builds on this module's workloads

        return bench_tcp.run_row(name, quick)
    return trio.run(ASYNC_WORKLOADS[name], quick)


def skip_reason(name: str) -> str | None:
    """Why workload ``name`` cannot run here (None: it can): the TCP rows need network namespaces."""
    if name.endswith("-tcp"):
        from omni_trio.netns import unavailable

        reason = unavailable()
        return None if reason is None else f"the TCP rows run between network namespaces: {reason}"
    return None


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments of ``python -m omni_trio.bench``."""
    parser = argparse.ArgumentParser(prog="omni_trio.bench", description="Run the omni-trio benchmark suite.")
    parser.add_argument("--quick", action="store_true", help="small counts: the whole suite in well under a minute")
    parser.add_argument("--json", default="out/bench.json", metavar="PATH", help="where to write the results")
    groups = "; ".join(f"{group} = {'+'.join(names)}" for group, names in GROUPS.items())
    parser.add_argument("--only", metavar="LIST",
                        help=f"comma-separated workloads out of {','.join(WORKLOADS)} (or groups: {groups})")
    parser.add_argument("--inline", action="store_true",
                        help="run the no-op and text stages' compute on their event loops "
                             "(SimpleScheduler(inline=True)) instead of their scheduler threads")
    parser.add_argument("--vs-sglang-omni", action="store_true",
                        help="also run each workload on SGLang-Omni 0.1.9, right after ours, and print "
                             "ours/theirs ratios (install: docs/benchmarks.md)")
    args = parser.parse_args(argv)
    if args.only:
        chosen = [w for name in args.only.split(",") if name.strip() for w in GROUPS.get(name.strip(), (name.strip(),))]
        unknown = [name for name in chosen if name not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
        args.workloads = chosen
    else:
        args.workloads = list(WORKLOADS)
    return args


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen workloads, print a table, write the JSON; 0 if every workload ran, 1 otherwise
    (2 when ``--vs-sglang-omni`` is asked for but SGLang-Omni is not importable)."""
    args = parse_args(argv)
    STAGE_FACTORY.clear()
    if args.inline:
        STAGE_FACTORY["inline"] = True
    comparison = None
    if args.vs_sglang_omni:
        from omni_trio import bench_sglang

        problem = bench_sglang.unavailable_message()
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
        comparison = bench_sglang.Comparison(args.quick)
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name in args.workloads:
        reason = skip_reason(name)
        if reason is not None:
            skipped[name] = reason
            print(f"skipping {name}: {reason}", file=sys.stderr, flush=True)
            continue
        print(f"running {name}...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            results[name] = run_workload(name, args.quick)
        except Exception as exc:  # noqa: BLE001 - one failed workload must not hide the others' numbers
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {name} failed: {errors[name]}", file=sys.stderr, flush=True)
        else:
            print(f"  {name} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        if comparison is not None:
            comparison.run(name)
    rows = [(name, metric, _fmt(value)) for name, metrics in results.items() for metric, value in metrics.items()]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(("workload", "metric", "value"))]
    print(f"{'workload':<{widths[0]}}  {'metric':<{widths[1]}}  {'value':>{widths[2]}}")
    for workload, metric, value in rows:
        print(f"{workload:<{widths[0]}}  {metric:<{widths[1]}}  {value:>{widths[2]}}")
    document = {
        "quick": args.quick,
        "inline_stages": args.inline,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "workloads": results,
        "errors": errors,
        "skipped": skipped,
    }
    if comparison is not None:
        print(f"\nomni-trio vs SGLang-Omni (ours/theirs; the 'better' column says which way wins)\n"
              f"{comparison.table(results)}")
        document["sglang_omni"] = comparison.document(results)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 1 if errors or (comparison is not None and comparison.errors) else 0


if __name__ == "__main__":
    sys.exit(main())
