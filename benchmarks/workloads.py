"""The benchmark workloads W1-W9, the floor, idle and serve rows: each one a function of ``quick``
that runs real pipelines and returns its metrics (:mod:`benchmarks.run` runs and prints them).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import multiprocessing
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import trio

from benchmarks import replicas as replica_bench
from benchmarks.measure import (
    W5_REQUESTS,
    copy_costs,
    descendant_pids,
    percentiles_ms,
    proc_cpu_ticks,
    time_streams,
)
from benchmarks.stages import MB, chain_config, fanin_config, stream_config, tensor_config
from omni_trio.config import PipelineConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.events import StreamMessage
from omni_trio.runtime.pipeline import open_pipeline

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
    """Chain of 2 no-op stages, sequential requests (``config``: placed otherwise, benchmarks/tcp.py)."""
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


async def concurrent_run(pipeline: Pipeline, total: int, in_flight: int, *, warmup: int) -> float:
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
    async with open_pipeline(config or stream_config(chunks)) as pipeline:
        return await time_streams(
            lambda request_id: pipeline.stream(request_id, "x", params={"chunks": chunks}),
            lambda event: isinstance(event, StreamMessage),
            chunks,
            2 if q else W5_REQUESTS,
        )


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
    from omni_trio.serve import serve_http

    make_config = importlib.import_module("examples.omni_speech.pipeline").make_config
    model = "omni-speech-bench"
    config = attrs.evolve(make_config("processes"), serve=ServeConfig(
        model=model, adapter="examples.omni_speech.serve.SpeechAdapter", adapter_options={"max_new_tokens": 24}))
    rounds = {1: 2 if q else 10, 8: 1 if q else 3}
    samples: dict[str, list[tuple[float, float]]] = {}
    async with open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
        address = await nursery.start(serve_http, pipeline, config, "127.0.0.1", 0)
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


def _round_trips(warmup: int, count: int, send: Callable[[], object], receive: Callable[[], object]) -> list[float]:
    """Seconds per ``send(); receive()`` round trip, ``count`` of them after ``warmup``."""
    samples = []
    for i in range(warmup + count):
        started = time.perf_counter()
        send()
        receive()
        if i >= warmup:
            samples.append(time.perf_counter() - started)
    return samples


def _unix_echo(path: str, count: int) -> None:
    """The far side of ``floor``'s Unix row: read 8 bytes, write them back, ``count`` times."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        for _ in range(count):
            sock.sendall(sock.recv(8))


@contextlib.contextmanager
def _echo_child(echo: str, *args: object) -> Iterator[None]:
    """Run this module's function ``echo(*args)`` in a spawned child (the far side of a floor row)."""
    # By module path, so that the spawned child imports it even when this file runs as __main__.
    target = getattr(importlib.import_module(__name__), echo)
    child = multiprocessing.get_context("spawn").Process(target=target, args=args)
    child.start()
    try:
        yield
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def _unix_floor(warmup: int, count: int) -> list[float]:
    """Round trips of 8 bytes over a plain Unix stream socket (the same-host link's transport) with a child."""
    with tempfile.TemporaryDirectory(prefix="omnitrio-bench-") as tmp, socket.socket(socket.AF_UNIX) as listener:
        listener.bind(f"{tmp}/floor")
        listener.listen()
        with _echo_child("_unix_echo", f"{tmp}/floor", warmup + count):
            sock, _ = listener.accept()
            with sock:
                return _round_trips(warmup, count, lambda: sock.sendall(b"x" * 8), lambda: sock.recv(8))


def _zmq_floor(warmup: int, count: int) -> list[float]:
    """Round trips of 8 bytes over pyzmq PUSH/PULL (ipc) with a child."""
    import zmq

    with tempfile.TemporaryDirectory(prefix="omnitrio-bench-") as tmp:
        out_addr, back_addr = f"ipc://{tmp}/out", f"ipc://{tmp}/back"
        context = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.bind(out_addr)
        pull = context.socket(zmq.PULL)
        pull.bind(back_addr)
        try:
            with _echo_child("_zmq_echo", out_addr, back_addr, warmup + count):
                return _round_trips(warmup, count, lambda: push.send(b"x" * 8), pull.recv)
        finally:
            push.close(linger=0)
            pull.close(linger=0)
            context.term()


def _p50_p99_us(samples: list[float], prefix: str = "") -> dict[str, float]:
    ordered = sorted(samples)
    return {f"{prefix}p50_us": statistics.median(ordered) * 1e6,
            f"{prefix}p99_us": ordered[int(0.99 * (len(ordered) - 1))] * 1e6}


def floor_sync(q: bool) -> dict[str, float]:
    """Raw round trips between this process and a child, without omni-trio: pyzmq PUSH/PULL over ipc
    (``p50_us``, ``p99_us``; the transport between hosts) and a Unix stream socket (``unix_*``; the
    transport of the same-host link)."""
    warmup, count = (50, 200) if q else (500, 5000)
    return {**_p50_p99_us(_zmq_floor(warmup, count)), **_p50_p99_us(_unix_floor(warmup, count), "unix_"),
            "n": float(count)}
