"""What a listener hears, from arrival times: the serving benchmark's arithmetic (no runtime, no I/O).

A stream is the time its request was sent and the arrivals of its audio, each ``(time, samples)``:
a whole 80 ms chunk in process, whatever bytes one HTTP read returned over HTTP.

- **TTFP** (time to first audio): first arrival - sent.
- **Real-time factor**: (last arrival - sent) / seconds of audio; below 1 keeps up.
- **Gaps**: playback starts when the first audio arrives and runs at the sample rate without stopping,
  so the audio that starts ``s`` samples in is due ``s / rate`` seconds after the first arrival. An
  arrival is *late* by ``arrival - due`` (the first never is); it is a gap at tolerance ``tol`` when it is
  late by more than ``tol`` (a player with ``tol`` of jitter buffer would have run dry). A stream is
  gap-free at ``tol`` when none of its arrivals is.
- **Underrun seconds**: a player that stops when it runs dry and resumes when audio comes (each stop
  pushes the rest of the schedule back): the total time it stood still.
- Per run: TTFP percentiles, the share of gap-free streams at each tolerance (of the streams admitted:
  a failed stream is not gap-free; refused ones are counted apart), underrun seconds, and **goodput**:
  gap-free streams per second of the run's wall time; and how long a refused stream took to hear
  its refusal (**refusal time**: the refusal's arrival - sent).
"""

from __future__ import annotations

import math
import random
from typing import Any

import attrs

from benchmarks.measure import percentiles_ms

#: Tolerances (ms) of the gap-free rates and goodputs.
TOLERANCES_MS = (50, 100, 200)
OUTCOMES = ("ok", "refused", "failed")


@attrs.define
class StreamRecord:
    """One request's stream as the client saw it (``time.perf_counter`` seconds)."""

    sent: float
    arrivals: list[tuple[float, int]] = attrs.Factory(list)
    finished: float | None = None
    outcome: str = "ok"  # ok | refused (429 / QueueFullError) | failed
    error: str = ""


def lateness_s(arrivals: list[tuple[float, int]], sample_rate: int) -> list[float]:
    """How late each arrival is against playback started at the first one (0 for the first)."""
    if not arrivals:
        return []
    start = arrivals[0][0]
    late, offset = [], 0
    for arrived, samples in arrivals:
        late.append(max(0.0, arrived - (start + offset / sample_rate)))
        offset += samples
    return late


def underrun_s(arrivals: list[tuple[float, int]], sample_rate: int) -> float:
    """Seconds a player that waits whenever it runs dry stands still, from the first arrival on."""
    if not arrivals:
        return 0.0
    stalled = 0.0
    playing_until = arrivals[0][0]
    for arrived, samples in arrivals:
        if arrived > playing_until:
            stalled += arrived - playing_until
            playing_until = arrived
        playing_until += samples / sample_rate
    return stalled


def stream_metrics(record: StreamRecord, sample_rate: int) -> dict[str, Any]:
    """One completed stream: TTFP, real-time factor, audio seconds, worst lateness, gaps per tolerance."""
    if not record.arrivals or record.finished is None:
        raise ValueError("a stream with no audio or no end has no metrics")
    late = lateness_s(record.arrivals, sample_rate)
    audio = sum(samples for _, samples in record.arrivals) / sample_rate
    return {
        "ttfp_s": record.arrivals[0][0] - record.sent,
        "rtf": (record.arrivals[-1][0] - record.sent) / audio,
        "audio_s": audio,
        "max_late_s": max(late),
        "underrun_s": underrun_s(record.arrivals, sample_rate),
        "gaps": {str(tol): sum(1 for x in late if x > tol / 1000) for tol in TOLERANCES_MS},
    }


def summarize(records: list[StreamRecord], sample_rate: int, wall_s: float) -> dict[str, Any]:
    """One run's numbers (see the module); every stream is counted in exactly one outcome."""
    counts = {outcome: sum(1 for r in records if r.outcome == outcome) for outcome in OUTCOMES}
    if sum(counts.values()) != len(records):
        raise ValueError(f"unknown outcomes in {sorted({r.outcome for r in records})}")
    done = [stream_metrics(r, sample_rate) for r in records if r.outcome == "ok"]
    admitted = counts["ok"] + counts["failed"]
    gap_free = {str(tol): sum(1 for m in done if m["gaps"][str(tol)] == 0) for tol in TOLERANCES_MS}
    rtfs = sorted(m["rtf"] for m in done)
    refusals = [r.finished - r.sent for r in records if r.outcome == "refused" and r.finished is not None]
    return {
        "streams": len(records),
        "completed": counts["ok"],
        "refused": counts["refused"],
        "failed": counts["failed"],
        "wall_s": wall_s,
        "ttfp_ms": percentiles_ms([m["ttfp_s"] for m in done]) if done else None,
        "rtf": {"p50": _rank(rtfs, 50), "p99": _rank(rtfs, 99), "max": rtfs[-1]} if done else None,
        "gap_free_rate": {tol: (n / admitted if admitted else None) for tol, n in gap_free.items()},
        "goodput_per_s": {tol: n / wall_s for tol, n in gap_free.items()},
        "underrun_s": {"total": sum(m["underrun_s"] for m in done),
                       "max": max((m["underrun_s"] for m in done), default=0.0)},
        "max_late_ms": max((m["max_late_s"] for m in done), default=0.0) * 1000,
        "audio_s": sum(m["audio_s"] for m in done),
        "refusal_ms": percentiles_ms(refusals) if refusals else None,
        "errors": sorted({r.error for r in records if r.outcome == "failed"})[:5],
    }


def _rank(ordered: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def load_offsets(load: dict[str, Any], seed: int) -> list[float]:
    """Seconds after the start at which a Poisson load (``{"kind": "rate", "value": per_s,
    "duration_s": D}``) sends its requests: exponential gaps of mean ``1 / per_s``, seeded, within D."""
    rng = random.Random(seed)
    offsets, t = [], rng.expovariate(load["value"])
    while t < load["duration_s"]:
        offsets.append(t)
        t += rng.expovariate(load["value"])
    return offsets


def run_entry(runtime: str, driver: str, load: dict[str, Any], records: list[StreamRecord], wall: float,
              cpu: dict[str, float], sample_rate: int) -> dict[str, Any]:
    """One run's JSON: its load, its summary and the CPU seconds per stream of each process."""
    summary = summarize(records, sample_rate, wall)
    streams = max(summary["streams"] - summary["refused"], 1)
    return {"runtime": runtime, "driver": driver, "load": load, **summary,
            "cpu_s_per_stream": {"total": sum(cpu.values()) / streams,
                                 "processes": {name: s / streams for name, s in sorted(cpu.items())}}}
