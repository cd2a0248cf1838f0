"""The serving benchmark's model, written once for both runtimes: a talker step, a vocoder, the talker's
hand-written iteration-level scheduler (SGLang-Omni's side) and the vocoder's stream hooks.

Nothing here imports a runtime: :mod:`benchmarks.serving_stages` (omni-trio) and
:mod:`benchmarks.serving_sglang_child` (SGLang-Omni) hand in their message classes and queues, and put
:class:`VocoderHooks` in front of their own ``StreamingSimpleScheduler``.

The shape is Qwen-Omni's: a talker makes one codec frame (16 codebook ids) per request per decode step,
every active request in one batched step; a vocoder turns each frame into 80 ms of 24 kHz PCM16
(1920 samples) as soon as it arrives. Two costs, chosen to be honest about where the time goes:

- The talker step **sleeps** ``base_ms + per_request_ms * batch`` (:class:`StepCost`). On a real server a
  decode step runs on the accelerator while the host thread waits with the GIL released; ``time.sleep``
  is exactly that wait. A CPU torch op of the same length would instead burn one of this machine's two
  cores for the whole step and starve the vocoder, the runtime and the clients: it would model a
  CPU-only server, which no omni deployment is.
- The vocoder runs a **real torch op** per chunk (an embedding sum and a linear layer to 1920 samples,
  then int16 conversion, one thread): that work is host CPU on a real server too (the PCM ends up in
  host memory as bytes), so it should cost CPU here.

:class:`TalkerStep` is the step alone (a batch of states in, one frame each out), separate from its
scheduling: omni-trio runs it in its built-in ``ContinuousBatchingScheduler``
(:mod:`benchmarks.serving_stages`); SGLang-Omni, which has no such scheduler, in the hand-written
:class:`BatchingTalker`. Both join new requests between steps up to the same batch size.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

import attrs
import torch

#: PCM the vocoder emits: 16-bit mono at this rate, one chunk per codec frame.
SAMPLE_RATE = 24_000
CHUNK_SAMPLES = 1920  # 80 ms at 24 kHz
CHUNK_S = CHUNK_SAMPLES / SAMPLE_RATE
CODEBOOKS = 16
CODEBOOK_SIZE = 2048


@attrs.frozen
class StepCost:
    """What one talker decode step costs: ``base_ms + per_request_ms * batch`` milliseconds."""

    base_ms: float = 10.0
    per_request_ms: float = 0.5

    def seconds(self, batch: int) -> float:
        """The step time of a batch of ``batch`` requests, in seconds."""
        return (self.base_ms + self.per_request_ms * batch) / 1000


@attrs.define
class TalkerState:
    """One request in the talker: its id, how many frames it wants and how many it has."""

    request_id: str
    frames: int
    made: int = 0

    @property
    def done(self) -> bool:
        """All its frames are made."""
        return self.made >= self.frames


class TalkerStep:
    """One batched decode step: every state in the batch gets its next codec frame (int64 ``[16]``)."""

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self._codebooks = torch.arange(CODEBOOKS, dtype=torch.int64)

    def __call__(self, batch: list[TalkerState]) -> list[torch.Tensor]:
        time.sleep(self.cost.seconds(len(batch)))  # the accelerator's step: the host waits, GIL released
        frames = []
        for state in batch:
            frames.append((self._codebooks * 131 + state.made * 17 + len(state.request_id)) % CODEBOOK_SIZE)
            state.made += 1
        return frames


class BatchingTalker:
    """The talker's scheduler for SGLang-Omni's side, by hand (the protocol: ``inbox``/``outbox``,
    ``warm_up_serving_thread``, ``start``, ``stop``, ``abort``): iteration-level batching.

    New requests wait in FIFO order and join the active batch between steps, up to ``max_batch``; each
    step emits one ``stream`` message per active request (its frame, for the vocoder) and a ``result``
    (``{"frames": n}``) for each request that made its last frame. With nothing active the loop blocks on
    ``inbox.get()``; while active it only takes what is already queued (``get_nowait``), so it never
    polls. ``stop()`` wakes it with a ``wakeup`` message; ``abort()`` marks a request, which the loop
    drops before its next step. ``params["frames"]`` (else ``frames``) is the utterance's length.
    """

    def __init__(self, step: TalkerStep, max_batch: int, frames: int, *, inbox: queue.Queue[Any],
                 outbox: queue.Queue[Any], incoming: type, outgoing: type) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.inbox = inbox
        self.outbox = outbox
        self.step = step
        self.max_batch = max_batch
        self.frames = frames
        self._incoming = incoming
        self._outgoing = outgoing
        self._waiting: collections.deque[tuple[Any, TalkerState]] = collections.deque()
        self._active: dict[str, tuple[Any, TalkerState]] = {}
        self._lock = threading.Lock()
        self._aborted: set[str] = set()

    def warm_up_serving_thread(self) -> None:
        """One thread for torch, like a real model's stage."""
        torch.set_num_threads(1)

    def start(self) -> None:
        """The serve loop (scheduler thread)."""
        while True:
            messages = [self.inbox.get()] if not (self._active or self._waiting) else []
            while True:
                try:
                    messages.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for msg in messages:
                if msg.type == "wakeup":
                    return
                if msg.type == "new_request":
                    frames = int(msg.data.request.params.get("frames", self.frames))
                    self._waiting.append((msg.data, TalkerState(msg.request_id, frames)))
            self._drop_aborted()
            while self._waiting and len(self._active) < self.max_batch:
                payload, state = self._waiting.popleft()
                self._active[state.request_id] = (payload, state)
            if self._active:
                self._step_batch()

    def stop(self) -> None:
        """Wake a blocked ``start`` so that it returns."""
        self.inbox.put(self._incoming("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Mark ``request_id`` (the stage's thread); the loop drops it before its next step."""
        with self._lock:
            self._aborted.add(request_id)

    def _drop_aborted(self) -> None:
        with self._lock:
            aborted, self._aborted = self._aborted, set()
        if aborted:
            for request_id in aborted:
                self._active.pop(request_id, None)
            self._waiting = collections.deque(item for item in self._waiting if item[1].request_id not in aborted)

    def _step_batch(self) -> None:
        batch = [state for _, state in self._active.values()]
        for state, frame in zip(batch, self.step(batch), strict=True):
            self.outbox.put(self._outgoing(state.request_id, "stream", data=frame))
            if state.done:
                payload, _ = self._active.pop(state.request_id)
                payload.data = {"frames": state.made}
                self.outbox.put(self._outgoing(state.request_id, "result", data=payload))


class VocoderModel:
    """Codec frame -> 80 ms of PCM16 bytes: an embedding sum and a linear layer (fixed seed), one thread."""

    def __init__(self, hidden: int = 256, seed: int = 5) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.embedding = torch.randn(CODEBOOKS * CODEBOOK_SIZE, hidden, generator=generator) * 0.1
        self.projection = torch.randn(CHUNK_SAMPLES, hidden, generator=generator) / hidden**0.5
        self._offsets = torch.arange(CODEBOOKS, dtype=torch.int64) * CODEBOOK_SIZE

    @torch.no_grad()
    def __call__(self, codes: torch.Tensor) -> bytes:
        hidden = self.embedding[codes + self._offsets].sum(0)
        wave = torch.tanh(torch.nn.functional.linear(hidden, self.projection))
        return (wave * 32767).to(torch.int16).numpy().tobytes()


class VocoderHooks:
    """The vocoder's hooks, put in front of a runtime's ``StreamingSimpleScheduler`` (its base's
    ``__init__`` runs with ``compute_fn=None``): every frame becomes a PCM16 chunk for the caller
    (``metadata={"modality": "audio"}``), and the talker's result ``{"frames": n}`` ends the request with
    ``{"frames", "samples", "sample_rate"}``."""

    outgoing_type: type

    def __init__(self, model: VocoderModel, outgoing: type) -> None:
        super().__init__(compute_fn=None)  # type: ignore[call-arg]  # the runtime's scheduler, next in the MRO
        self.model = model
        self.outgoing_type = outgoing
        self.counts: dict[str, int] = {}

    def warm_up_serving_thread(self) -> None:
        """One thread for torch, and one chunk made, so that the first request is not slow."""
        torch.set_num_threads(1)
        self.model(torch.zeros(CODEBOOKS, dtype=torch.int64))

    def is_streaming_payload(self, payload: Any) -> bool:
        """Every request streams."""
        return True

    def on_stream_chunk(self, request_id: str, item: Any) -> list[Any]:
        """One frame in, one PCM chunk out."""
        self.counts[request_id] = self.counts.get(request_id, 0) + 1
        return [self.outgoing_type(request_id, "stream", data=self.model(item.data), metadata={"modality": "audio"})]

    def on_stream_done(self, request_id: str) -> list[Any]:
        """The talker's result is here and its stream ended: the request's result."""
        made = self.counts.pop(request_id, 0)
        payload = self.stream_payloads[request_id]  # type: ignore[attr-defined]  # the scheduler's
        if made != payload.data["frames"]:
            raise RuntimeError(f"vocoder got {made} frames, the talker made {payload.data['frames']}")
        payload.data = {"frames": made, "samples": made * CHUNK_SAMPLES, "sample_rate": SAMPLE_RATE}
        return [self.outgoing_type(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        """Forget an aborted request's count."""
        self.counts.pop(request_id, None)
