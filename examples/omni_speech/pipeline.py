"""The omni_speech pipeline's config, and what a client needs around it.

* :func:`make_config` builds the pipeline for a placement: ``embedded`` (every
  stage in the caller's process) or ``processes`` (one worker process per
  model; ``preprocess`` shares the text encoder's);
* :func:`speak` streams one request and collects its PCM with timings;
* :func:`stage_breakdown` and :func:`stream_timing` read per-stage and
  per-stream times of a request back from the trace;
* :func:`write_wav` writes PCM as a 16-bit WAV file (stdlib ``wave``).
"""

from __future__ import annotations

import os
import sys
import time
import wave
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch
import trio

import omni_trio as ot
from examples.placement import process_for

M = "examples.omni_speech.stages"

PLACEMENTS = ("embedded", "processes")
#: The worker process of each stage in the ``processes`` placement.
PROCESS_OF = {
    "preprocess": "p_text",
    "text_encoder": "p_text",
    "audio_encoder": "p_audio",
    "thinker": "p_thinker",
    "talker": "p_talker",
    "vocoder": "p_vocoder",
}
STAGES = tuple(PROCESS_OF)


def make_config(placement: str = "embedded", *, base_path: str | None = None) -> ot.PipelineConfig:
    """The pipeline, its stages placed by ``placement`` (``embedded`` or ``processes``).

    ``base_path`` is where the ``processes`` placement creates its IPC directory.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")

    def stage(name: str, **fields: Any) -> ot.StageConfig:
        return ot.StageConfig(name=name, factory_path=f"{M}.create_{name}",
                              process=process_for(placement, PROCESS_OF[name]), **fields)

    return ot.PipelineConfig(
        entry_stage="preprocess",
        stages=[
            # Fan-out: each request goes to the encoders it needs, each encoder gets only its part.
            stage("preprocess", next=["text_encoder", "audio_encoder"], route_fn=f"{M}.route_encoders",
                  project_payload={"text_encoder": f"{M}.to_text_encoder",
                                   "audio_encoder": f"{M}.to_audio_encoder"}),
            stage("text_encoder", next="thinker"),
            stage("audio_encoder", next="thinker"),  # batches concurrent requests
            # Fan-in: wait for the encoders route_encoders chose, merge, then decode token by token.
            stage("thinker", next="talker", stream_to=["talker"], wait_for=["text_encoder", "audio_encoder"],
                  wait_for_fn=f"{M}.expected_encoders", merge_fn=f"{M}.merge_encodings"),
            # Streams: tokens -> codec frames -> PCM to the caller.
            stage("talker", next="vocoder", stream_to=["vocoder"], can_accept_stream_before_payload=True),
            stage("vocoder", terminal=True, can_accept_stream_before_payload=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base_path),
    )


# ---------------------------------------------------------------------------------- one request


@attrs.define
class Speech:
    """One streamed request: its PCM, its chunks' ids and arrival times, its result."""

    request_id: str
    started_ns: int
    pcm_chunks: list[torch.Tensor] = attrs.Factory(list)
    chunk_ids: list[int] = attrs.Factory(list)
    chunk_ns: list[int] = attrs.Factory(list)
    result: dict[str, Any] | None = None
    finished_ns: int = 0

    @property
    def pcm(self) -> torch.Tensor:
        """All PCM samples, float32."""
        return torch.cat(self.pcm_chunks) if self.pcm_chunks else torch.zeros(0)

    @property
    def sample_rate(self) -> int:
        return int(self.result["sample_rate"]) if self.result else 16_000

    @property
    def time_to_first_audio_s(self) -> float:
        return (self.chunk_ns[0] - self.started_ns) / 1e9

    @property
    def wall_s(self) -> float:
        return (self.finished_ns - self.started_ns) / 1e9

    @property
    def audio_s(self) -> float:
        return self.pcm.numel() / self.sample_rate

    @property
    def real_time_factor(self) -> float:
        """Wall time over audio time: below 1 means faster than real time."""
        return self.wall_s / self.audio_s


def request_params(
    audio: bool | dict[str, Any] | None = None, max_new_tokens: int | None = None
) -> dict[str, Any]:
    """A request's ``params``: ``audio`` (``True`` or ``synthesize_audio`` arguments), ``max_new_tokens``."""
    params: dict[str, Any] = {}
    if audio:
        params["audio"] = audio
    if max_new_tokens is not None:
        params["max_new_tokens"] = max_new_tokens
    return params


async def speak(pipeline: ot.Pipeline, request_id: str, text: str, **params: Any) -> Speech:
    """Stream one request through ``pipeline``; ``params`` as for :func:`request_params`."""
    speech = Speech(request_id, time.time_ns())
    async with pipeline.stream(request_id, text, params=request_params(**params)) as events:
        async for event in events:
            if isinstance(event, ot.StreamMessage):
                speech.chunk_ns.append(time.time_ns())
                speech.chunk_ids.append(event.chunk_id)
                speech.pcm_chunks.append(event.chunk)
            elif isinstance(event, ot.CompleteMessage):
                speech.result = event.result
    speech.finished_ns = time.time_ns()
    return speech


def write_wav(path: str | os.PathLike[str], pcm: torch.Tensor, sample_rate: int) -> None:
    """Mono 16-bit PCM WAV from float samples in [-1, 1]."""
    samples = (pcm.clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    with wave.open(os.fspath(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(samples.numpy().astype("<i2").tobytes())


# ---------------------------------------------------------------------------------------- trace


T = TypeVar("T")


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def run_demo(main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``trio.run(main, *args)`` for the demo's commands: Ctrl-C prints one line and exits 130 (the
    pipeline closed as on any exit), a failed request one ``error:`` line each and exits 1."""
    try:
        return trio.run(main, *args)
    except BaseException as error:
        leaves = _leaves(error)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            print("interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        if leaves and all(isinstance(leaf, ot.RequestError) for leaf in leaves):
            for leaf in leaves:
                print(f"error: {leaf}", file=sys.stderr)
            raise SystemExit(1) from None
        raise


def exit_after(main: Callable[[], object]) -> None:
    """Run a demo command's ``main``, then end the process at once with its exit code.

    After Ctrl-C the pipeline is closed, but a compute it interrupted may still run on a stage's
    scheduler thread (torch cannot be interrupted); letting it meet the interpreter's shutdown aborts
    the process (SIGABRT) instead of exiting 130. Output is flushed first; cleanup in ``main`` (its
    ``with`` blocks) has run by then.
    """
    code = 0
    try:
        main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def remove_trace(path: str | os.PathLike[str]) -> None:
    """Delete a trace file and its per-process siblings (trace files are appended to)."""
    path = Path(path)
    suffix = path.suffix or ".jsonl"
    for old in [path, *path.parent.glob(f"{path.stem}.*{suffix}")]:
        old.unlink(missing_ok=True)


@attrs.frozen
class StageTime:
    """A stage's ``stage_dispatch`` and ``stage_complete`` for one request, in ms after it was submitted."""

    stage: str
    dispatch_ms: float
    complete_ms: float

    @property
    def in_stage_ms(self) -> float:
        return self.complete_ms - self.dispatch_ms


@attrs.frozen
class StreamTime:
    """The chunks one stream edge carried for one request, in ms after it was submitted."""

    from_stage: str
    to_stage: str
    chunks: int
    first_ms: float
    last_ms: float


def _submitted_ns(events: list[dict[str, Any]], request_id: str) -> int:
    for event in events:
        if event["event"] == "request_submitted" and event.get("request_id") == request_id:
            return int(event["ts_ns"])
    raise KeyError(f"no request_submitted event for {request_id!r}")


def stage_breakdown(events: list[dict[str, Any]], request_id: str) -> list[StageTime]:
    """Pair each stage's ``stage_dispatch`` with its ``stage_complete`` for ``request_id``, in dispatch order."""
    start = _submitted_ns(events, request_id)
    dispatched: dict[str, int] = {}
    times = []
    for event in events:
        if event.get("request_id") != request_id:
            continue
        if event["event"] == "stage_dispatch":
            dispatched[event["stage"]] = event["ts_ns"]
        elif event["event"] == "stage_complete" and event["stage"] in dispatched:
            begin = dispatched.pop(event["stage"])
            times.append(StageTime(event["stage"], (begin - start) / 1e6, (event["ts_ns"] - start) / 1e6))
    return sorted(times, key=lambda t: t.dispatch_ms)


def stream_timing(events: list[dict[str, Any]], request_id: str) -> list[StreamTime]:
    """Per stream edge: chunks sent, first and last send (``comm_stream_send``: edges between processes)."""
    start = _submitted_ns(events, request_id)
    sends: dict[tuple[str, str], list[int]] = defaultdict(list)
    chunks: dict[tuple[str, str], int] = defaultdict(int)
    for event in events:
        if event["event"] == "comm_stream_send" and event.get("request_id") == request_id:
            edge = (event["from_stage"], event["to_stage"])
            sends[edge].append(event["ts_ns"])
            chunks[edge] += event["chunk_count"]  # a run of small chunks travels as one message
    return [
        StreamTime(src, dst, chunks[(src, dst)], (min(ts) - start) / 1e6, (max(ts) - start) / 1e6)
        for (src, dst), ts in sorted(sends.items(), key=lambda item: min(item[1]))
    ]


def describe(speech: Speech, events: list[dict[str, Any]]) -> list[str]:
    """The per-stage and per-stream time breakdown of one request, as printable lines."""
    start = _submitted_ns(events, speech.request_id)
    lines = [f"{'stage':14} {'dispatch':>10} {'complete':>10} {'in stage':>10}   (ms after submit)"]
    for t in stage_breakdown(events, speech.request_id):
        # A streaming stage's payload arrives behind its stream: what it shows is the backlog it still had.
        note = "   (computed while its input streamed in)" if t.stage in ("talker", "vocoder") else ""
        lines.append(f"{t.stage:14} {t.dispatch_ms:10.1f} {t.complete_ms:10.1f} {t.in_stage_ms:10.1f}{note}")
    lines.append(f"{'stream':22} {'chunks':>6} {'first':>10} {'last':>10}")
    streams = stream_timing(events, speech.request_id)
    for s in streams:
        lines.append(f"{s.from_stage + ' -> ' + s.to_stage:22} {s.chunks:6d} {s.first_ms:10.1f} {s.last_ms:10.1f}")
    if not any(s.to_stage != "coordinator" for s in streams):
        lines.append("(stream edges inside one process are not traced; --placement processes traces them)")
    if speech.chunk_ns:
        first, last = ((ns - start) / 1e6 for ns in (speech.chunk_ns[0], speech.chunk_ns[-1]))
        lines.append(f"{'vocoder -> caller':22} {len(speech.chunk_ns):6d} {first:10.1f} {last:10.1f}   (received)")
    return lines
