"""The benchmark workloads of :mod:`omni_trio.bench`, run through SGLang-Omni 0.1.9 for comparison.

``python -m omni_trio.bench --vs-sglang-omni`` runs each workload on omni-trio and then, through
:func:`run_workload`, the same workload on SGLang-Omni's own pipeline core
(``MultiProcessPipelineRunner``, its ``Coordinator``, ``SimpleScheduler`` and
``StreamingSimpleScheduler``, each stage in a spawned process of its own unless the workload says
otherwise) and prints ours-over-theirs ratios. The stages below are the equivalents of ``bench.py``'s,
written against SGLang-Omni's API; every metric key is the same as in ``bench.py``.

SGLang-Omni is not a dependency: it is installed in a separate virtual environment with the recipe
in ``docs/benchmarks.md``. Its imports pull GPU-only packages, so each run happens in a child
interpreter (``python -m omni_trio.bench_sglang NAME``, asyncio, as SGLang-Omni needs) whose
``PYTHONPATH`` starts with ``benchmarks/sglang_shims``: tiny modules of ours that stand in for those
imports. Nothing of SGLang-Omni's code is copied here.

``floor`` (raw pyzmq and Unix socket round trips) involves no pipeline runtime, so it has no SGLang-Omni side. One
difference is forced by SGLang-Omni's API: in ``W5`` its vocoder forwards each chunk to the caller as a
list of 8 ints, because it sends stream messages to the caller with msgpack, which refuses tensors
(ours forwards the tensor itself); the talker-to-vocoder hop carries tensors on both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omni_trio.bench_measure import (
    W5_REQUESTS,
    copy_costs,
    descendant_pids,
    percentiles_ms,
    proc_cpu_ticks,
    time_streams,
)

SGLANG_OMNI_VERSION = "0.1.9"
ROOT = Path(__file__).resolve().parent.parent
SHIMS = ROOT / "benchmarks" / "sglang_shims"
RECIPE = "docs/benchmarks.md, section 'Comparing with SGLang-Omni'"
M = "omni_trio.bench_sglang"
MB = 1 << 20
NOTES: dict[str, str] = {
    "W5": "SGLang-Omni's vocoder forwards each chunk to the caller as a list (its caller-bound stream is msgpack)",
}
"""Differences forced by SGLang-Omni's API, printed under the comparison table."""
NOT_COMPARABLE: dict[str, str] = {
    "floor": "raw pyzmq and Unix socket round trips, no pipeline runtime: the same for both, not run for SGLang-Omni",
    "W9": "stage replicas: SGLang-Omni's pipeline core has no replicas of a stage, so there is nothing to compare",
    "serve": "omni-trio's own HTTP front end (ot.serve); SGLang-Omni's server needs its model stack, not run here",
    **{
        f"{w}-tcp": "across hosts over CURVE TCP: SGLang-Omni's pipeline core places its stages on one host"
        for w in ("W1", "W4", "W5")
    },
}
"""Workloads with no SGLang-Omni side, and why."""
RESULT_PREFIX = "BENCH_SGLANG_RESULT "


# --------------------------------------------------------------------------- availability


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _child_env() -> dict[str, str]:
    """The environment of a child run: the shims, then this repository, first on ``PYTHONPATH``."""
    env = dict(os.environ)
    parts = [str(SHIMS), str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


@functools.cache
def unavailable_reason() -> str | None:
    """Why SGLang-Omni cannot run here (``None`` when it can). Checks the installed versions, then
    imports its pipeline runner in a child interpreter with the shims (a few seconds, done once)."""
    if importlib.util.find_spec("sglang_omni") is None or importlib.util.find_spec("sglang") is None:
        return "sglang_omni / sglang are not installed in this interpreter"
    version = _installed_version("sglang-omni")
    if version != SGLANG_OMNI_VERSION:
        return f"sglang-omni {version} is installed; the comparison is written for {SGLANG_OMNI_VERSION}"
    if not SHIMS.is_dir():
        return f"the import shims are missing ({SHIMS})"
    probe = subprocess.run(
        [sys.executable, "-c", "import sglang_omni.pipeline.mp_runner"],
        env=_child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"importing sglang_omni.pipeline.mp_runner failed: {last}"
    return None


def available() -> bool:
    """Whether SGLang-Omni 0.1.9 and its pipeline core are importable (with the shims) here."""
    return unavailable_reason() is None


# --------------------------------------------------------------------------- parent side


def run_workload(name: str, quick: bool, timeout_s: float = 900.0) -> dict[str, float]:
    """Run one workload on SGLang-Omni in a fresh child interpreter; the same metric keys as
    :func:`omni_trio.bench.run_workload`. Raises ``ValueError`` for a workload it cannot express and
    ``RuntimeError`` when the child fails."""
    if name in NOT_COMPARABLE:
        raise ValueError(f"{name}: {NOT_COMPARABLE[name]}")
    command = [sys.executable, "-m", M, name, *(["--quick"] if quick else [])]
    proc = subprocess.run(command, cwd=ROOT, env=_child_env(), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX) and proc.returncode == 0:
            metrics = json.loads(line[len(RESULT_PREFIX):])
            return {key: float(value) for key, value in metrics.items()}
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    raise RuntimeError(f"SGLang-Omni run of {name} exited with {proc.returncode}:\n{tail}")


def unavailable_message() -> str | None:
    """The error ``--vs-sglang-omni`` prints when SGLang-Omni cannot run here (``None`` when it can)."""
    reason = unavailable_reason()
    if reason is None:
        return None
    return (f"--vs-sglang-omni needs SGLang-Omni {SGLANG_OMNI_VERSION} importable: {reason}. "
            f"Install it in a separate virtual environment with the recipe in {RECIPE}, "
            "and run `python -m omni_trio.bench --vs-sglang-omni` from that environment.")


class Comparison:
    """SGLang-Omni's side of a ``--vs-sglang-omni`` run: :meth:`run` each workload right after ours
    (alternating, so that both share the machine's noise), then :meth:`table` and :meth:`document`."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.results: dict[str, dict[str, float]] = {}
        self.errors: dict[str, str] = {}
        self.notes: dict[str, str] = {}

    def run(self, name: str) -> None:
        """Run ``name`` on SGLang-Omni and record its metrics, its error, or why it has no side there."""
        if name in NOT_COMPARABLE:
            self.notes[name] = NOT_COMPARABLE[name]
            return
        print(f"running {name} on sglang-omni...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            self.results[name] = run_workload(name, self.quick)
        except Exception as exc:  # noqa: BLE001 - one failed workload must not hide the others' numbers
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {name} on sglang-omni failed: {self.errors[name]}", file=sys.stderr, flush=True)
            return
        if name in NOTES:
            self.notes[name] = NOTES[name]
        print(f"  {name} on sglang-omni done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    def table(self, ours: dict[str, dict[str, float]]) -> str:
        """The side-by-side table, with the notes and errors under it."""
        notes = {**self.notes, **{name: f"failed on sglang-omni: {error}" for name, error in self.errors.items()}}
        return table(ours, self.results, notes)

    def document(self, ours: dict[str, dict[str, float]]) -> dict[str, Any]:
        """The JSON of SGLang-Omni's side: its metrics, errors, notes and the ours/theirs ratios."""
        return {
            "version": _installed_version("sglang-omni"),
            "workloads": self.results,
            "errors": self.errors,
            "notes": self.notes,
            "ratios_ours_over_theirs": {name: compare(ours[name], metrics)
                                        for name, metrics in self.results.items() if name in ours},
            "better": {metric: direction(metric) for metrics in self.results.values() for metric in metrics
                       if direction(metric)},
        }


def direction(metric: str) -> str:
    """``"lower"`` or ``"higher"`` when that value of ``metric`` is better; ``""`` for a metric with no
    ours/theirs ratio: counts, and W4's in-process copy/clone references (a property of the machine,
    measured on each side) and each side's transfer-over-copy ratios (shown side by side)."""
    if metric.endswith(("_copy_ms", "_clone_ms")) or "_ratio_vs_" in metric:
        return ""
    if metric.endswith("_per_s"):
        return "higher"
    if metric.endswith(("_ms", "_us")) or metric.startswith("cpu_percent"):
        return "lower"
    return ""


def ratio(ours: float, theirs: float) -> float | None:
    """``ours / theirs``, or ``None`` where it is undefined (``theirs`` is 0)."""
    if theirs == 0:
        return None
    return ours / theirs


def their_metric(metric: str) -> str:
    """The metric of SGLang-Omni's run that ours is compared with: the same one, except that W4's
    ``ot.empty`` column (``4MB_empty_latency_ms``...) is compared with their only way to send a tensor."""
    return metric.replace("_empty_", "_")


def compare(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float | None]:
    """Ours-over-theirs ratio of every metric both have that is better lower or higher."""
    return {metric: ratio(value, theirs[their_metric(metric)]) for metric, value in ours.items()
            if their_metric(metric) in theirs and direction(metric)}


def table(ours: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]],
          notes: dict[str, str]) -> str:
    """The side-by-side table printed by ``--vs-sglang-omni``."""
    header = ("workload", "metric", "omni-trio", "sglang-omni", "ours/theirs", "better")
    rows: list[tuple[str, ...]] = []
    for name, metrics in ours.items():
        other = theirs.get(name, {})
        for metric, value in metrics.items():
            better = direction(metric)
            theirs_value = other.get(their_metric(metric))
            r = ratio(value, theirs_value) if theirs_value is not None and better else None
            rows.append((
                name, metric, _fmt(value),
                _fmt(theirs_value) if theirs_value is not None else "-",
                f"{r:.3f}" if r is not None else "-",
                {"lower": "lower (<1: ours)", "higher": "higher (>1: ours)"}.get(better, "")
                if theirs_value is not None else "",
            ))
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(cell.ljust(widths[i]) if i in (0, 1, 5) else cell.rjust(widths[i])
                       for i, cell in enumerate(row)).rstrip() for row in [header, *rows]]
    lines += [f"{name}: {note}" for name, note in notes.items()]
    return "\n".join(lines)


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


# --------------------------------------------------------------------------- stage factories (SGLang-Omni workers)


def create_noop() -> Any:
    """A stage that returns each payload unchanged."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    return SimpleScheduler(lambda payload: payload)


def create_tensor_source() -> Any:
    """Returns ``{"t": <float32 tensor>}`` of the request's ``numel`` param, made once per size."""
    import torch
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    cache: dict[int, Any] = {}

    def fn(payload: Any) -> Any:
        numel = int(payload.request.params["numel"])
        if numel not in cache:
            cache.clear()
            cache[numel] = torch.ones(numel, dtype=torch.float32)
        payload.data = {"t": cache[numel]}
        return payload

    return SimpleScheduler(fn)


def create_tensor_sink() -> Any:
    """Takes ``{"t": tensor}`` and returns its element count and last element."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        t = payload.data["t"]
        payload.data = {"numel": int(t.numel()), "last": float(t[-1])}
        return payload

    return SimpleScheduler(fn)


class ChunkTalker:
    """A talker (SGLang-Omni's scheduler protocol): for each request, pushes ``chunks`` int64 tensors of
    8 elements as stream output, then its payload as the result."""

    def __init__(self, chunks: int) -> None:
        from sglang_omni.scheduling.message import IncomingMessage, OutgoingMessage

        self.incoming_type = IncomingMessage
        self.outgoing_type = OutgoingMessage
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.chunks = chunks
        self.running = False

    def warm_up_serving_thread(self) -> None:
        """Nothing to warm up."""

    def start(self) -> None:
        """Serve requests until :meth:`stop`."""
        import torch

        self.running = True
        while self.running:
            try:
                msg = self.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if msg.type != "new_request":
                continue
            payload = msg.data
            chunks = int(payload.request.params.get("chunks", self.chunks))
            for step in range(chunks):
                codes = torch.arange(step * 8, step * 8 + 8, dtype=torch.int64)
                self.outbox.put(self.outgoing_type(msg.request_id, "stream", data=codes))
            payload.data = {"chunks": chunks}
            self.outbox.put(self.outgoing_type(msg.request_id, "result", data=payload))

    def stop(self) -> None:
        """Let the serving loop return."""
        self.running = False

    def abort(self, request_id: str) -> None:
        """Requests finish on their own; nothing to drop."""


def create_chunk_talker(chunks: int = 1000) -> ChunkTalker:
    """A :class:`ChunkTalker`."""
    return ChunkTalker(chunks)


def create_forwarding_vocoder() -> Any:
    """A ``StreamingSimpleScheduler`` that forwards every chunk it receives to the caller (as a list:
    SGLang-Omni sends stream messages to the caller with msgpack, which refuses tensors)."""
    from sglang_omni.scheduling.message import OutgoingMessage
    from sglang_omni.scheduling.streaming_simple_scheduler import (
        StreamingSimpleScheduler,
    )

    class ForwardingVocoder(StreamingSimpleScheduler):
        def __init__(self) -> None:
            super().__init__(compute_fn=None)
            self.counts: dict[str, int] = {}

        def is_streaming_payload(self, payload: Any) -> bool:
            return True

        def on_stream_chunk(self, request_id: str, item: Any) -> list[Any]:
            self.counts[request_id] = self.counts.get(request_id, 0) + 1
            # The caller-bound stream of SGLang-Omni is msgpack: a tensor cannot pass, its 8 values can.
            return [OutgoingMessage(request_id, "stream", data=item.data.tolist(), metadata={"modality": "codes"})]

        def on_stream_done(self, request_id: str) -> list[Any]:
            payload = self.stream_payloads[request_id]
            payload.data = {"forwarded": self.counts.pop(request_id, 0)}
            return [OutgoingMessage(request_id, "result", data=payload)]

        def clear_stream_state(self, request_id: str) -> None:
            self.counts.pop(request_id, None)

    return ForwardingVocoder()


def create_split() -> Any:
    """Splits the input text into words."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        text = payload.data["raw_inputs"]
        payload.data = {"text": text, "words": text.split()}
        return payload

    return SimpleScheduler(fn)


def create_upper() -> Any:
    """Upper-cases the text."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        payload.data = {"upper": payload.data["text"].upper()}
        return payload

    return SimpleScheduler(fn)


def create_count() -> Any:
    """Counts the words."""
    from sglang_omni.scheduling.simple_scheduler import SimpleScheduler

    def fn(payload: Any) -> Any:
        payload.data = {"count": len(payload.data["words"])}
        return payload

    return SimpleScheduler(fn)


def merge(inputs: dict[str, Any]) -> Any:
    """Fan-in: merge the payloads of ``upper`` and ``count`` (in name order)."""
    from sglang_omni.proto import StagePayload

    first = next(iter(inputs.values()))
    data: dict[str, Any] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data.update(inputs[name].data)
    return StagePayload(first.request_id, first.request, data)


# --------------------------------------------------------------------------- configs (child side)


@functools.cache
def _base_dir() -> tempfile.TemporaryDirectory[str]:
    """Where the child's pipelines put their sockets: removed, with everything in it, when the child exits."""
    return tempfile.TemporaryDirectory(prefix="omnitrio-bench-sglang-")


def _pipeline(name: str, entry: str, stages: list[dict[str, Any]]) -> Any:
    from sglang_omni.config.schema import (
        EndpointsConfig,
        PipelineConfig,
        StageConfig,
    )

    return PipelineConfig(
        model_path="bench", name=name, entry_stage=entry,
        endpoints=EndpointsConfig(base_path=tempfile.mkdtemp(prefix="run-", dir=_base_dir().name)),
        stages=[StageConfig(**stage) for stage in stages],
    )


def chain_config(stages: int, *, one_process: bool = False) -> Any:
    """A chain of ``stages`` no-op stages, each in its own process (or all in one)."""
    names = [f"s{i}" for i in range(stages)]
    return _pipeline(f"bench-chain{stages}", names[0], [
        {"name": name, "process": "p_all" if one_process else f"p_{name}", "factory_path": f"{M}.create_noop",
         "next": names[i + 1] if i + 1 < stages else None, "terminal": i + 1 == stages}
        for i, name in enumerate(names)
    ])


def tensor_config() -> Any:
    """source -> sink, two processes."""
    return _pipeline("bench-tensor", "source", [
        {"name": "source", "process": "p_source", "factory_path": f"{M}.create_tensor_source", "next": "sink"},
        {"name": "sink", "process": "p_sink", "factory_path": f"{M}.create_tensor_sink", "terminal": True},
    ])


def stream_config(chunks: int) -> Any:
    """talker =stream=> vocoder -> caller, two processes."""
    return _pipeline("bench-stream", "talker", [
        {"name": "talker", "process": "p_talker", "factory_path": f"{M}.create_chunk_talker",
         "factory": {"chunks": chunks}, "next": "vocoder", "stream_to": ["vocoder"]},
        {"name": "vocoder", "process": "p_vocoder", "factory_path": f"{M}.create_forwarding_vocoder",
         "terminal": True, "can_accept_stream_before_payload": True},
    ])


def fanin_config() -> Any:
    """split -> (upper, count) -> join, a process each."""
    return _pipeline("bench-fanin", "split", [
        {"name": "split", "process": "p_split", "factory_path": f"{M}.create_split", "next": ["upper", "count"]},
        {"name": "upper", "process": "p_upper", "factory_path": f"{M}.create_upper", "next": "join"},
        {"name": "count", "process": "p_count", "factory_path": f"{M}.create_count", "next": "join"},
        {"name": "join", "process": "p_join", "factory_path": f"{M}.create_noop",
         "wait_for": ["upper", "count"], "merge_fn": f"{M}.merge", "terminal": True},
    ])


# --------------------------------------------------------------------------- workloads (child side, asyncio)


class _Runner:
    """``async with _Runner(config) as coordinator``: SGLang-Omni's runner, started and always stopped."""

    def __init__(self, config: Any) -> None:
        from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

        self.runner = MultiProcessPipelineRunner(config)

    async def __aenter__(self) -> Any:
        await self.runner.start(timeout=300)
        return self.runner.coordinator

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.stop()


def _request(inputs: Any, **params: Any) -> Any:
    from sglang_omni.proto import OmniRequest

    return OmniRequest(inputs=inputs, params=params)


async def sequential_latency(config: Any, requests: int, warmup: int, inputs: Any = "x") -> dict[str, float]:
    """Run ``warmup`` then ``requests`` requests one after another; latency percentiles."""
    samples: list[float] = []
    async with _Runner(config) as coordinator:
        for i in range(warmup):
            await coordinator.submit(f"warm-{i}", inputs)
        for i in range(requests):
            started = time.perf_counter()
            await coordinator.submit(f"r-{i}", inputs)
            samples.append(time.perf_counter() - started)
    return percentiles_ms(samples)


async def w1(q: bool) -> dict[str, float]:
    """Chain of 2 no-op stages, sequential requests."""
    return await sequential_latency(chain_config(2), 20 if q else 500, 5 if q else 50)


async def w2(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, sequential requests."""
    return await sequential_latency(chain_config(4), 20 if q else 500, 5 if q else 50)


async def w3(q: bool) -> dict[str, float]:
    """Chain of 4 no-op stages, many requests in flight: throughput."""
    total, in_flight = (200, 16) if q else (2000, 64)
    async with _Runner(chain_config(4)) as coordinator:
        for i in range(10):
            await coordinator.submit(f"warm-{i}", "x")
        next_id = 0

        async def client() -> None:
            nonlocal next_id
            while next_id < total:
                rid = next_id
                next_id += 1
                await coordinator.submit(f"r-{rid}", "x")

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(in_flight)))
        elapsed = time.perf_counter() - started
    return {"requests_per_s": total / elapsed, "requests": float(total), "in_flight": float(in_flight),
            "elapsed_s": elapsed}


async def w4(q: bool) -> dict[str, float]:
    """A float32 tensor from a source process to a sink process; compared with in-process copies."""
    sizes_mb = [1] if q else [4, 64]
    runs = 3 if q else 7
    result: dict[str, float] = {}
    async with _Runner(tensor_config()) as coordinator:
        for size in sizes_mb:
            numel = size * MB // 4
            await coordinator.submit(f"warm-{size}", _request("x", numel=numel))
            samples = []
            for i in range(runs):
                started = time.perf_counter()
                out = await coordinator.submit(f"r-{size}-{i}", _request("x", numel=numel))
                samples.append(time.perf_counter() - started)
                if out["numel"] != numel:
                    raise RuntimeError(f"sink saw {out['numel']} elements, expected {numel}")
            latency = statistics.median(samples)
            copy_s, clone_s = copy_costs(numel, max(runs, 5))
            result[f"{size}MB_latency_ms"] = latency * 1000
            result[f"{size}MB_MB_per_s"] = size / latency
            result[f"{size}MB_copy_ms"] = copy_s * 1000
            result[f"{size}MB_clone_ms"] = clone_s * 1000
            result[f"{size}MB_ratio_vs_copy"] = latency / copy_s
            result[f"{size}MB_ratio_vs_clone"] = latency / clone_s
    return result


async def w5(q: bool) -> dict[str, float]:
    """A talker streams small chunks to a forwarding vocoder in another process, which forwards them."""
    from sglang_omni.proto import StreamMessage

    chunks = 50 if q else 1000
    async with _Runner(stream_config(chunks)) as coordinator:
        return await time_streams(
            lambda request_id: contextlib.aclosing(coordinator.stream(request_id, _request("x", chunks=chunks))),
            lambda event: isinstance(event, StreamMessage),
            chunks,
            2 if q else W5_REQUESTS,
        )


async def w6(q: bool) -> dict[str, float]:
    """Fan-out and fan-in across four processes."""
    return await sequential_latency(fanin_config(), 20 if q else 500, 5 if q else 50, inputs="hello omni trio world")


async def w7(q: bool) -> dict[str, float]:
    """The 4-stage chain with every stage in one process."""
    return await sequential_latency(chain_config(4, one_process=True), 20 if q else 500, 5 if q else 50)


async def w8(q: bool) -> dict[str, float]:
    """Start-up (``start`` until ready) and shutdown (``stop``) of the 4-stage chain."""
    from sglang_omni.pipeline.mp_runner import MultiProcessPipelineRunner

    runs = 1 if q else 5
    starts, stops = [], []
    for i in range(runs):
        runner = MultiProcessPipelineRunner(chain_config(4))
        started = time.perf_counter()
        await runner.start(timeout=300)
        ready = time.perf_counter()
        try:
            await runner.coordinator.submit(f"check-{i}", "x")  # outside both timings
        finally:
            closing = time.perf_counter()
            await runner.stop()
        stops.append(time.perf_counter() - closing)
        starts.append(ready - started)
    return {"startup_ms": statistics.median(starts) * 1000, "shutdown_ms": statistics.median(stops) * 1000,
            "runs": float(runs)}


async def idle(q: bool) -> dict[str, float]:
    """CPU of a started, idle 4-stage pipeline: this process and its worker processes."""
    seconds = 0.5 if q else 3.0
    async with _Runner(chain_config(4)) as coordinator:
        await coordinator.submit("warm", "x")
        await asyncio.sleep(0.2)
        pids = [os.getpid(), *descendant_pids(os.getpid())]
        before = {pid: proc_cpu_ticks(pid) for pid in pids}
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        after = {pid: proc_cpu_ticks(pid) for pid in pids}
        elapsed = time.perf_counter() - started
    ticks = sum(after[pid] - before[pid] for pid in pids)
    cpu_s = ticks / os.sysconf("SC_CLK_TCK")
    return {"cpu_percent_of_core": 100 * cpu_s / elapsed, "processes": float(len(pids)), "seconds": elapsed,
            "cpu_ticks": float(ticks)}


WORKLOADS = {"W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, "W7": w7, "W8": w8, "idle": idle}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: run one workload on SGLang-Omni and print its metrics as one JSON line."""
    parser = argparse.ArgumentParser(prog=M, description="One benchmark workload on SGLang-Omni (a child of bench).")
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    metrics = asyncio.run(WORKLOADS[args.workload](args.quick))
    if not all(math.isfinite(value) for value in metrics.values()):
        raise RuntimeError(f"non-finite metric in {metrics}")
    print(RESULT_PREFIX + json.dumps(metrics), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
