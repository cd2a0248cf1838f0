"""Admission of streaming requests: refuse a new stream while the admitted ones cannot keep real time.

Past saturation every stream slows together: admitting one more stream makes all of them underrun.
:class:`StreamAdmission` decides, from what the coordinator sees of its live streams, whether a new
one may start (``config.stream_admission``, :class:`~omni_trio.StreamAdmissionConfig`):

- ``fixed``: at most ``max_streams`` streams live at once.
- ``adaptive``: each stream keeps a playback clock, as a player would: playback starts at its first
  timed chunk, every chunk adds its playback seconds, and a chunk arriving more than
  ``stall_tolerance_s`` after the clock ran dry is a stall (the clock restarts from that arrival; a
  player buffers that much, and a late core on a loaded machine is no saturation). A stream is
  *behind* while its buffered
  playback is under ``min_slack_s`` or it stalled less than ``recover_s`` ago (the hysteresis:
  refusals stop once the streams have played without a stall that long). New streams are refused
  while any stream is behind. A chunk's playback seconds are what the stream's reader declares
  (:meth:`~omni_trio.RequestStream.declare_playback`; the HTTP server declares each audio chunk's
  samples / rate, when it sends it); a stream whose reader declares nothing is timed by its own
  cadence: its first ``cadence_arrivals`` arrivals (chunks delivered together count once) set its
  seconds per chunk, and each later chunk adds that pace times ``1 + cadence_tolerance`` to its
  playback clock. Such a stream is behind only once a chunk came after its clock ran dry (a stall
  seen), never merely because nothing came for a while: its producer may be waiting on purpose (for
  input, for a tool), which says nothing about the pipeline's load. Text chunks are not timed (nobody
  plays them). A stream with no known deadline yet never causes a refusal, so a pipeline below
  saturation never sees one.

  Stalls are seen only once streams already underrun. So that a burst of new streams does not push
  the admitted ones past real time in the first place, the adaptive mode also learns the pipeline's
  *pace* against load: for declared streams, the wall seconds each playback second took to arrive,
  by how many streams were live (:class:`PaceTrend`). Once it has seen two loads, a line through
  them predicts the pace with one more stream; past ``max_pace`` (0.9: a tenth of real time kept in
  hand) the new stream is refused. The trend follows the machine: other work on it slows the pace,
  and the predicted capacity falls with it.
- ``off``: never refuses.

The coordinator feeds it (:meth:`started`, :meth:`arrived`, :meth:`declared`, :meth:`ended`) and asks
:meth:`refusal` before admitting a stream; times are ``trio.current_time()``, so it is tested on
``MockClock`` without processes.
"""

from __future__ import annotations

import statistics

from omni_trio.config.settings import StreamAdmissionConfig

__all__ = ["StreamAdmission"]


class _Playback:
    """One stream's playback clock: when its buffered playback runs out, and when it last ran dry."""

    def __init__(self, tolerance: float) -> None:
        self.end: float | None = None
        self.stalled_at: float | None = None
        self._tolerance = tolerance

    def add(self, now: float, seconds: float) -> None:
        """``seconds`` of playback arrived at ``now``."""
        if self.end is None:
            self.end = now
        elif now > self.end:
            if now > self.end + self._tolerance:
                self.stalled_at = now
            self.end = now
        self.end += seconds


class _Cadence:
    """The pace of a stream whose reader declares no playback: seconds per chunk, once established."""

    def __init__(self) -> None:
        self.last_at: float | None = None
        self.intervals: list[float] = []  # seconds per chunk between consecutive arrivals
        self.last_chunks = 0  # chunks delivered at last_at
        self.per_chunk: float | None = None


class _Stream:
    def __init__(self, stall_tolerance: float) -> None:
        self.playback = _Playback(stall_tolerance)
        self.cadence = _Cadence()
        self.declared = False
        self.last_declared: tuple[float, float] | None = None  # (when, playback seconds) of its last chunk


class PaceTrend:
    """Wall seconds per playback second of declared streams, by the number of live streams, and the
    line through them (weighted least squares over the loads seen; recent data counts most)."""

    #: Playback seconds a load's figures hold before they are halved: the trend follows the machine.
    HALF_LIFE_S = 30.0
    #: Playback seconds a load needs before it counts in the line.
    MIN_SECONDS = 1.0

    def __init__(self) -> None:
        self._by_load: dict[int, list[float]] = {}  # live streams -> [wall seconds, playback seconds]

    def add(self, live: int, wall_s: float, playback_s: float) -> None:
        """``playback_s`` of a stream's audio took ``wall_s`` to arrive while ``live`` streams were live."""
        sums = self._by_load.setdefault(live, [0.0, 0.0])
        sums[0] += wall_s
        sums[1] += playback_s
        if sums[1] > self.HALF_LIFE_S:
            sums[0] /= 2
            sums[1] /= 2

    def pace(self, live: int) -> float | None:
        """The predicted wall seconds per playback second with ``live`` streams; None before two loads are known."""
        points = [(load, wall / played, played) for load, (wall, played) in self._by_load.items()
                  if played >= self.MIN_SECONDS]
        if len({load for load, _, _ in points}) < 2:
            return None
        total = sum(weight for _, _, weight in points)
        mean_load = sum(load * weight for load, _, weight in points) / total
        mean_pace = sum(pace * weight for _, pace, weight in points) / total
        spread = sum(weight * (load - mean_load) ** 2 for load, _, weight in points)
        slope = sum(weight * (load - mean_load) * (pace - mean_pace) for load, pace, weight in points) / spread
        return mean_pace + max(0.0, slope) * (live - mean_load)


class StreamAdmission:
    """Whether a new stream may start, from the live streams' playback deadlines (module docstring)."""

    def __init__(self, config: StreamAdmissionConfig) -> None:
        self._config = config
        self._streams: dict[str, _Stream] = {}
        self._trend = PaceTrend()

    def refusal(self, now: float) -> str | None:
        """Why a new stream is refused at ``now``, or None when it may start."""
        config = self._config
        if config.mode == "fixed":
            assert config.max_streams is not None  # validated with the config
            if len(self._streams) >= config.max_streams:
                return (f"{len(self._streams)} streams are live "
                        f"(stream_admission.max_streams={config.max_streams}); retry when one finishes")
            return None
        if config.mode == "off":
            return None
        for request_id, stream in self._streams.items():
            reason = self._behind(stream, now)
            if reason is not None:
                return f"stream {request_id!r} {reason}, so the live streams cannot take one more; retry later"
        pace = self._trend.pace(len(self._streams) + 1)
        if pace is not None and pace > config.max_pace:
            return (f"with {len(self._streams) + 1} streams the pipeline would make a second of audio in "
                    f"{pace:.2f}s (stream_admission.max_pace={config.max_pace}); retry later")
        return None

    def _behind(self, stream: _Stream, now: float) -> str | None:
        playback = stream.playback
        if playback.end is None:
            return None
        if playback.stalled_at is not None and now - playback.stalled_at < self._config.recover_s:
            return (f"ran dry {now - playback.stalled_at:.3f}s ago "
                    f"(stream_admission.recover_s={self._config.recover_s})")
        slack = playback.end - now
        if stream.declared and slack < self._config.min_slack_s:
            return f"has {slack:.3f}s of playback buffered (stream_admission.min_slack_s={self._config.min_slack_s})"
        return None

    def started(self, request_id: str) -> None:
        """A stream was admitted."""
        self._streams[request_id] = _Stream(self._config.stall_tolerance_s)

    def ended(self, request_id: str) -> None:
        """A stream was resolved (done, failed or aborted)."""
        self._streams.pop(request_id, None)

    def declared(self, request_id: str, now: float, seconds: float) -> None:
        """The stream's reader sent ``seconds`` of playback at ``now``: the stream is timed by these from now on."""
        stream = self._streams.get(request_id)
        if stream is None:
            return
        if not stream.declared:
            stream.declared = True
            stream.playback = _Playback(self._config.stall_tolerance_s)  # what its cadence said is superseded
        elif stream.last_declared is not None:
            # The time this chunk took after the one before, against what the one before plays for.
            last_at, last_seconds = stream.last_declared
            self._trend.add(len(self._streams), now - last_at, last_seconds)
        stream.last_declared = (now, seconds)
        stream.playback.add(now, seconds)

    def arrived(self, request_id: str, now: float, modality: str | None) -> None:
        """A chunk of the stream reached the coordinator at ``now`` (chunks of one message share their time)."""
        stream = self._streams.get(request_id)
        if stream is None or stream.declared or modality == "text":
            return
        cadence = stream.cadence
        if cadence.last_at == now:
            cadence.last_chunks += 1
            if cadence.per_chunk is not None:
                self._timed(stream, now, cadence.per_chunk)
            return
        if cadence.last_at is not None:
            cadence.intervals.append((now - cadence.last_at) / cadence.last_chunks)
        cadence.last_at, cadence.last_chunks = now, 1
        if cadence.per_chunk is None and len(cadence.intervals) >= self._config.cadence_arrivals:
            # The median: a stream's first chunks often come in a burst, or after a slow first step.
            cadence.per_chunk = statistics.median(cadence.intervals)
        if cadence.per_chunk is not None:
            self._timed(stream, now, cadence.per_chunk)

    def _timed(self, stream: _Stream, now: float, per_chunk: float) -> None:
        # A chunk "plays" for the pace with tolerance: arrivals at the pace build a little headroom, so a
        # short hiccup (a GC pause, a busy core) is absorbed, and only a lasting slowdown runs it dry.
        stream.playback.add(now, per_chunk * (1 + self._config.cadence_tolerance))
