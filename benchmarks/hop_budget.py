"""The per-step cost of one process hop, each step measured in isolation (tracing off).

Run: ``python -m benchmarks.hop_budget`` (from the repository root, in the test venv; ``--embedded``: only
the embedded pipelines, which also run against older trees, e.g. ``PYTHONPATH=<old tree>``, for an A/B;
the steps that name newer modules import them where they are measured). Prints one line per
step of the hop a W1/W2 payload takes between two worker processes, in microseconds (median of many
calls), and the end-to-end numbers they add up against: a raw pyzmq one-way message between two trio
loops (half a round trip) and a thread hand-off of the default ``SimpleScheduler``, cut into its segments
next to the raw loop<->thread floors and the ``async def``-on-the-loop round trip. torch is imported
first, as every stage module of a ported pipeline does (the data plane then walks payloads for tensors).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch  # noqa: F401 - imported as user stage modules do: it switches the payload walk on
import trio
import zmq

from omni_trio.comm.dataref import DataRef, DataRefKind
from omni_trio.comm.transfer import decode_object, encode_inline, tensor_bytes
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import decode, encode
from omni_trio.payload import OmniRequest, StagePayload
from omni_trio.scheduling import IncomingMessage, Outbox, SimpleScheduler
from omni_trio.stage.bridge import SchedulerThread, outbox_source

N = 3000


def per_call_us(fn: Callable[[], object], n: int = N) -> float:
    """Cost of ``fn()`` in µs: the fastest of ``n // 100`` blocks of 100 calls (robust to a busy machine)."""
    for _ in range(200):
        fn()
    blocks = []
    for _ in range(n // 100):
        start = time.perf_counter_ns()
        for _ in range(100):
            fn()
        blocks.append((time.perf_counter_ns() - start) / 100 / 1000)
    return min(blocks)


def _payload() -> StagePayload:
    return StagePayload("req-000001", OmniRequest(inputs="x"), {"raw_inputs": "x"})


def codec_steps() -> dict[str, float]:
    """Sender and receiver steps of the control message and its inline DataRef."""
    from omni_trio.control.wire.auth import FrameMac, new_secret

    payload = _payload()
    kw: dict[str, Any] = {"sender": "s0", "target": "s1", "object_id": "req-000001:payload:s0:s1:7",
                          "kind": DataRefKind.stage_payload}
    ref = encode_inline(payload, **kw)
    assert ref is not None
    wire = ref.to_wire()
    msg = m.DataReady(request_id="req-000001", from_stage="s0", to_stage="s1", data_ref=wire)
    frames = encode(msg)
    decoded = decode(frames)
    assert isinstance(decoded, m.DataReady)
    auth = FrameMac(new_secret())
    sealed = [bytes(frame) for frame in auth.seal(frames)]
    assert auth.open(sealed, "bench") == frames

    async def read() -> object:
        return await decode_object(ref)

    def run_read() -> None:
        coro = read()
        with contextlib.suppress(StopIteration):
            coro.send(None)

    return {
        "send: encode_inline (walk + pickle payload)": per_call_us(lambda: encode_inline(payload, **kw)),
        "send: DataRef.to_wire": per_call_us(ref.to_wire),
        "send: DataReady(...) (validators)": per_call_us(
            lambda: m.DataReady(request_id="req-000001", from_stage="s0", to_stage="s1", data_ref=wire)
        ),
        "send: codec.encode": per_call_us(lambda: encode(msg)),
        "send: seal (the run's proof, keyed BLAKE2b)": per_call_us(lambda: auth.seal(frames)),
        "recv: open (check the proof)": per_call_us(lambda: auth.open(sealed, "bench")),
        "recv: codec.decode": per_call_us(lambda: decode(frames)),
        "recv: DataRef.from_wire": per_call_us(lambda: DataRef.from_wire(wire)),
        "recv: decode_object (unpickle payload)": per_call_us(run_read),
        "trio: checkpoint": _trio_checkpoint_us(),
        "trio: nursery.start_soon + task run": _trio_spawn_us(),
    }


def in_process_steps() -> dict[str, float]:
    """Steps a message pays inside one process: the byte count of an in-process edge, compute
    tracking around a compute, a request's cancel scope, and a result's sends on two lanes."""
    from omni_trio.scheduling import BusyTime
    from omni_trio.scheduling._support import RunningComputes
    from omni_trio.stage.scopes import RequestScopes
    payload = _payload()
    busy, computes = BusyTime(), RunningComputes()
    scopes = RequestScopes()

    def tracked() -> None:
        computes.start(("req-000001",))
        try:
            busy.call(_noop, payload)
        finally:
            computes.finish(("req-000001",))

    def scope() -> float:
        async def main() -> float:
            def enter() -> None:
                with scopes.open("req-000001"):
                    pass

            return per_call_us(enter)

        return trio.run(main)

    return {
        "in-process edge: tensor_bytes (W1 payload)": per_call_us(lambda: tensor_bytes(payload)),
        "compute: bare call of a no-op compute_fn": per_call_us(lambda: _noop(payload)),
        "compute: tracked (BusyTime.call + RunningComputes)": per_call_us(tracked),
        "stage: a request's cancel scope (RequestScopes.open)": scope(),
        "edge lanes: a result's sends to 2 destinations (fan_out)": _fan_out_us(),
        "edge lanes: the same 2 sends awaited in turn (no lanes)": _fan_out_us(lanes=False),
    }


def _noop(payload: object) -> object:
    return payload


def _fan_out_us(lanes: bool = True, n: int = N) -> float:
    """One result's two sends (no-op sends that checkpoint, as a socket send does) on idle lanes,
    per call: the fastest of blocks of 100, inside one trio run."""

    async def send() -> None:
        await trio.lowlevel.checkpoint()

    from omni_trio.stage.edges import EdgeQueues

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            edges = EdgeQueues(nursery)
            blocks = []
            for _ in range(n // 100 + 2):
                start = time.perf_counter_ns()
                for _ in range(100):
                    if lanes:
                        await edges.fan_out({"upper": send, "count": send})
                    else:
                        await send()
                        await send()
                blocks.append((time.perf_counter_ns() - start) / 100 / 1000)
            nursery.cancel_scope.cancel()
        return min(blocks[2:])

    return trio.run(main)


def embedded_request_us(blocks: int = 60, per: int = 20) -> dict[str, float]:
    """CPU µs per request of the bench's W1, W6 and W7 shapes with every stage on the caller's loop
    (``process=None``, ``inline=True``): no process hop, no thread, so what is left is the stages'
    own Python (routing, lanes, byte counts, tracking, trio's task switches). Fastest block of
    process CPU time, which the machine's other load does not inflate the way wall time does."""
    import attrs

    from benchmarks import stages as bench
    from omni_trio.runtime.pipeline import open_pipeline

    def embedded(config: Any) -> Any:
        stages = [attrs.evolve(s, process=None, factory={"inline": True}) for s in config.stages]
        return attrs.evolve(config, stages=stages)

    async def per_request(config: Any, inputs: str) -> float:
        async with open_pipeline(embedded(config)) as pipeline:
            for i in range(100):
                await pipeline.submit(f"warm-{i}", inputs)
            best = []
            for block in range(blocks):
                start = time.process_time_ns()
                for i in range(per):
                    await pipeline.submit(f"r-{block}-{i}", inputs)
                best.append((time.process_time_ns() - start) / per / 1000)
        return min(best)

    async def main() -> dict[str, float]:
        return {
            "embedded W1 (2-stage chain), CPU per request": await per_request(bench.chain_config(2), "x"),
            "embedded W6 (split/upper/count/join), CPU per request": await per_request(
                bench.fanin_config(), "hello omni trio world"
            ),
            "embedded W7 (4-stage chain), CPU per request": await per_request(bench.chain_config(4), "x"),
        }

    return trio.run(main)


def _trio_checkpoint_us() -> float:
    async def main() -> float:
        start = time.perf_counter_ns()
        for _ in range(N):
            await trio.lowlevel.checkpoint()
        return (time.perf_counter_ns() - start) / N / 1000

    return trio.run(main)


def _trio_spawn_us() -> float:
    async def noop() -> None:
        return None

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            start = time.perf_counter_ns()
            for _ in range(N):
                nursery.start_soon(noop)
                await trio.lowlevel.checkpoint()
            elapsed = time.perf_counter_ns() - start
        return elapsed / N / 1000 - _trio_checkpoint_us_inline

    return trio.run(main)


_trio_checkpoint_us_inline = 0.0


def _scheduler_round_trip_us(compute: Callable[[Any], Any], rounds: int, *, on_trio_loop: bool = False) -> float:
    """Median round trip of one request through ``SimpleScheduler(compute)``, attached to the loop as a
    stage attaches it: enqueue on the trio loop, compute, the Outbox's put wakes the loop's drain."""

    async def main() -> float:
        scheduler = SimpleScheduler(compute, run_on_trio_loop=on_trio_loop)
        thread = SchedulerThread("s", scheduler)
        source = outbox_source("s", scheduler.outbox)
        thread.start()
        await thread.warm.wait()
        samples = []
        async with trio.open_nursery() as nursery:
            scheduler.attach_loop(nursery)
            for i in range(rounds + 50):
                start = time.perf_counter_ns()
                scheduler.enqueue(IncomingMessage(f"r{i}", "new_request", i))
                batch = await source.next_batch()
                samples.append((time.perf_counter_ns() - start) / 1000)
                assert batch[0].data == i
            scheduler.stop()
        source.close()
        await thread.finished.wait()
        return statistics.median(samples[50:])

    return trio.run(main)


def scheduler_handoff_us(rounds: int = 500) -> float:
    """Round trip of one request through a default SimpleScheduler's thread: enqueue on the trio loop,
    compute on the scheduler thread, the Outbox's put wakes the loop's drain."""
    return _scheduler_round_trip_us(lambda payload: payload, rounds)


def handoff_segments(rounds: int = 500) -> dict[str, float]:
    """The default SimpleScheduler's round trip cut into its segments (medians, µs): enqueue on the loop
    -> compute starts on the scheduler thread -> the compute's result is put into the outbox -> the
    stage's drain has it (``next_batch`` returned on the loop). Timestamps from ``perf_counter_ns``,
    one clock for both threads; the outbox is the stage's own (its ``_put`` is the put's lock-held part)."""
    stamps: dict[str, int] = {}

    def compute(payload: int) -> int:
        stamps["compute"] = time.perf_counter_ns()
        return payload

    class StampedOutbox(Outbox):
        def _put(self, item: Any) -> None:
            stamps["put"] = time.perf_counter_ns()
            super()._put(item)

    async def main() -> dict[str, float]:
        scheduler = SimpleScheduler(compute)
        scheduler.outbox = StampedOutbox()
        thread = SchedulerThread("s", scheduler)
        source = outbox_source("s", scheduler.outbox)
        thread.start()
        await thread.warm.wait()
        rows: dict[str, list[float]] = {"enqueue -> compute": [], "compute -> outbox put": [],
                                        "outbox put -> drain has it": [], "round trip": []}
        for i in range(rounds + 50):
            start = time.perf_counter_ns()
            scheduler.enqueue(IncomingMessage(f"r{i}", "new_request", i))
            batch = await source.next_batch()
            end = time.perf_counter_ns()
            assert batch[0].data == i
            rows["enqueue -> compute"].append((stamps["compute"] - start) / 1000)
            rows["compute -> outbox put"].append((stamps["put"] - stamps["compute"]) / 1000)
            rows["outbox put -> drain has it"].append((end - stamps["put"]) / 1000)
            rows["round trip"].append((end - start) / 1000)
        scheduler.stop()
        source.close()
        await thread.finished.wait()
        return {f"hand-off: {name}": statistics.median(values[50:]) for name, values in rows.items()}

    return trio.run(main)


def async_on_loop_us(rounds: int = 500) -> float:
    """Round trip of one request through a SimpleScheduler whose compute is ``async def`` with
    ``run_on_trio_loop=True``, attached to the loop as a stage attaches it: enqueue -> a runner task
    computes -> the outbox put wakes the drain."""

    async def compute(payload: int) -> int:
        return payload

    return _scheduler_round_trip_us(compute, rounds, on_trio_loop=True)


def raw_thread_round_trip_us(rounds: int = 500) -> float:
    """The floor: a ``queue.Queue`` from the loop to a thread, ``run_sync_soon`` back, nothing else."""
    import queue

    async def main() -> float:
        token = trio.lowlevel.current_trio_token()
        inbox: queue.Queue[Any] = queue.Queue()
        back: list[Any] = []
        done = trio.lowlevel.ParkingLot()

        def arrived(item: Any) -> None:
            back.append(item)
            done.unpark()

        def body() -> None:
            while (item := inbox.get()) is not None:
                token.run_sync_soon(arrived, item)

        worker = threading.Thread(target=body, daemon=True)
        worker.start()
        samples = []
        for i in range(rounds + 50):
            start = time.perf_counter_ns()
            inbox.put(i)
            await done.park()
            samples.append((time.perf_counter_ns() - start) / 1000)
            assert back.pop() == i
        inbox.put(None)
        worker.join()
        return statistics.median(samples[50:])

    return trio.run(main)


def raw_eventfd_round_trip_us(rounds: int = 500) -> float:
    """The floor the stage's drain can reach: a ``queue.Queue`` to a thread, an eventfd write back that
    the loop awaits with ``wait_readable`` (no ``run_sync_soon``), nothing else."""
    import os
    import queue

    async def main() -> float:
        inbox: queue.Queue[Any] = queue.Queue()
        fd = os.eventfd(0, os.EFD_NONBLOCK)

        def body() -> None:
            while inbox.get() is not None:
                os.eventfd_write(fd, 1)

        worker = threading.Thread(target=body, daemon=True)
        worker.start()
        samples = []
        for i in range(rounds + 50):
            start = time.perf_counter_ns()
            inbox.put(i)
            await trio.lowlevel.wait_readable(fd)
            os.eventfd_read(fd)
            samples.append((time.perf_counter_ns() - start) / 1000)
        inbox.put(None)
        worker.join()
        trio.lowlevel.notify_closing(fd)
        os.close(fd)
        return statistics.median(samples[50:])

    return trio.run(main)


def _zmq_echo(pull: str, push: str, count: int) -> None:
    async def main() -> None:
        ctx = zmq.Context()
        rx, tx = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        rx.bind(pull)
        tx.connect(push)
        for _ in range(count):
            while not rx.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                await trio.lowlevel.wait_readable(rx.getsockopt(zmq.FD))
            tx.send_multipart(rx.recv_multipart())
        rx.close()
        tx.close()
        ctx.term()

    trio.run(main)


def zmq_round_trip_us(count: int = 1000) -> float:
    """A raw pyzmq PUSH/PULL round trip of a 200-byte message between two trio loops (two processes)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = f"ipc://{tmp}/a", f"ipc://{tmp}/b"
        child = multiprocessing.get_context("spawn").Process(target=_zmq_echo, args=(a, b, count + 100))
        child.start()

        async def main() -> float:
            ctx = zmq.Context()
            tx, rx = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
            tx.connect(a)
            rx.bind(b)
            samples = []
            body = [b"data_ready", b"x" * 200]
            for _ in range(count + 100):
                start = time.perf_counter_ns()
                tx.send_multipart(body)
                while not rx.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    await trio.lowlevel.wait_readable(rx.getsockopt(zmq.FD))
                rx.recv_multipart()
                samples.append((time.perf_counter_ns() - start) / 1000)
            tx.close()
            rx.close()
            ctx.term()
            return statistics.median(samples[100:])

        try:
            return trio.run(main)
        finally:
            child.join(10)


def main() -> int:
    """Print the budget."""
    global _trio_checkpoint_us_inline
    _trio_checkpoint_us_inline = _trio_checkpoint_us()
    only_embedded = "--embedded" in sys.argv[1:]
    if only_embedded:
        rows = embedded_request_us()
        width = max(len(k) for k in rows)
        for name, value in rows.items():
            print(f"{name:<{width}}  {value:8.1f} µs")
        return 0
    rows = codec_steps()
    rows.update(in_process_steps())
    rows.update(embedded_request_us())
    rows["scheduler hand-off, round trip (default SimpleScheduler)"] = scheduler_handoff_us()
    rows.update(handoff_segments())
    rows["floor: loop -> thread (queue.Queue) -> loop (run_sync_soon)"] = raw_thread_round_trip_us()
    rows["floor: loop -> thread (queue.Queue) -> loop (eventfd)"] = raw_eventfd_round_trip_us()
    rows["async def compute on the loop, round trip"] = async_on_loop_us()
    rows["raw pyzmq round trip between two trio loops"] = zmq_round_trip_us()
    width = max(len(k) for k in rows)
    for name, value in rows.items():
        print(f"{name:<{width}}  {value:8.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
