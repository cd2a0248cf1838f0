"""SGLang-Omni's side of ``python -m benchmarks serving --vs-sglang-omni``: the same stage code
(:mod:`benchmarks.serving_model`) on SGLang-Omni's pipeline core, one load, in a child interpreter
under asyncio with ``benchmarks/sglang_shims`` first on its ``PYTHONPATH`` (as :mod:`benchmarks.sglang`
runs the micro rows):

    python -m benchmarks.serving_sglang_child SHAPE_JSON LOAD_JSON SEED

Starts the talker and vocoder (a spawned process each), streams one warm-up utterance, runs the load
with ``coordinator.stream`` and prints, after :data:`RESULT_PREFIX`, one JSON line: every stream's
send time, arrivals ``(time, samples)``, end and outcome, the wall time and the CPU seconds of each
process. The parent (:mod:`benchmarks.serving_sglang`) does the arithmetic, the same as for ours.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from benchmarks.measure import descendant_pids, proc_cpu_ticks
from benchmarks.serving_metrics import StreamRecord, load_offsets
from benchmarks.serving_model import (
    BatchingTalker,
    StepCost,
    TalkerStep,
    VocoderHooks,
    VocoderModel,
)
from benchmarks.sglang_stages import _base_dir

RESULT_PREFIX = "BENCH_SERVING_SGLANG_RESULT "
M = "benchmarks.serving_sglang_child"


# --------------------------------------------------------------------------- stage factories (SGLang-Omni workers)


def create_talker(max_batch: int, frames: int, step_base_ms: float, step_per_request_ms: float) -> BatchingTalker:
    """The same talker as ours, with SGLang-Omni's message classes and plain queues (its stage runs a pump)."""
    import queue

    from sglang_omni.scheduling.message import IncomingMessage, OutgoingMessage

    step = TalkerStep(StepCost(step_base_ms, step_per_request_ms))
    return BatchingTalker(step, max_batch, frames, inbox=queue.Queue(), outbox=queue.Queue(),
                          incoming=IncomingMessage, outgoing=OutgoingMessage)


def create_vocoder() -> Any:
    """The same vocoder hooks as ours, on SGLang-Omni's ``StreamingSimpleScheduler``."""
    from sglang_omni.scheduling.message import OutgoingMessage
    from sglang_omni.scheduling.streaming_simple_scheduler import StreamingSimpleScheduler

    class Vocoder(VocoderHooks, StreamingSimpleScheduler):
        """The vocoder's hooks on SGLang-Omni's base."""

    return Vocoder(VocoderModel(), OutgoingMessage)


def make_config(shape: dict[str, Any]) -> Any:
    """talker -> vocoder, a process each; ``max_in_flight`` as the entry stage's admission limit (SGLang-Omni's
    coordinator then refuses with ``QueueFullError`` beyond it, as ours does)."""
    import tempfile

    from sglang_omni.config.schema import EndpointsConfig, PipelineConfig, StageConfig

    limit = shape["max_in_flight"]

    class ServingConfig(PipelineConfig):
        def entry_stage_admission_limit(self) -> int | None:
            return limit

    options = {key: shape[key] for key in ("max_batch", "frames", "step_base_ms", "step_per_request_ms")}
    return ServingConfig(
        model_path="bench", name="serving-bench", entry_stage="talker",
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="run-", dir=_base_dir().name)),
        stages=[
            StageConfig(name="talker", process="p_talker", factory_path=f"{M}.create_talker", factory=options,
                        next="vocoder", stream_to=["vocoder"]),
            StageConfig(name="vocoder", process="p_vocoder", factory_path=f"{M}.create_vocoder", terminal=True,
                        can_accept_stream_before_payload=True),
        ],
    )


# --------------------------------------------------------------------------- the load (asyncio)


async def one(coordinator: Any, request_id: str, frames: int) -> StreamRecord:
    """Stream one utterance; ``QueueFullError`` is a refusal."""
    from sglang_omni.admission import QueueFullError
    from sglang_omni.proto import OmniRequest, StreamMessage

    record = StreamRecord(time.perf_counter())
    try:
        async for event in coordinator.stream(request_id, OmniRequest(inputs="speak", params={"frames": frames})):
            if isinstance(event, StreamMessage):
                record.arrivals.append((time.perf_counter(), len(event.chunk) // 2))
    except QueueFullError:
        record.outcome = "refused"
    except Exception as exc:  # noqa: BLE001 - a failed stream is a result, counted as such
        record.outcome, record.error = "failed", f"{type(exc).__name__}: {exc}"
    record.finished = time.perf_counter()
    return record


async def run(shape: dict[str, Any], load: dict[str, Any], seed: int) -> dict[str, Any]:
    """Start the pipeline, warm it up, run ``load`` (the same arrivals as ours) and stop it."""
    from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

    runner = MultiProcessPipelineRunner(make_config(shape))
    await runner.start(timeout=300)
    try:
        coordinator = runner.coordinator
        await one(coordinator, "warm", shape["frames"])
        records: list[StreamRecord] = []

        async def client(name: str, count: int) -> None:
            for i in range(count):
                records.append(await one(coordinator, f"{name}-{i}", shape["frames"]))

        pids = [os.getpid(), *descendant_pids(os.getpid())]
        before = {pid: proc_cpu_ticks(pid) for pid in pids}
        started = time.perf_counter()
        if load["kind"] == "concurrency":
            await asyncio.gather(*(client(f"c{c}", int(load["rounds"])) for c in range(int(load["value"]))))
        else:
            tasks = []
            for i, offset in enumerate(load_offsets(load, seed)):
                await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
                tasks.append(asyncio.create_task(client(f"p{i}", 1)))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
        after = {pid: proc_cpu_ticks(pid) for pid in pids}
    finally:
        await runner.stop()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {("caller" if pid == os.getpid() else f"child ({pid})"): (after[pid] - before[pid]) / tick for pid in pids}
    return {"records": [[r.sent, r.arrivals, r.finished, r.outcome, r.error] for r in records], "wall_s": wall,
            "cpu_s": cpu}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: one load on SGLang-Omni, its raw streams as one JSON line."""
    shape_json, load_json, seed = sys.argv[1:] if argv is None else argv
    result = asyncio.run(run(json.loads(shape_json), json.loads(load_json), int(seed)))
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
