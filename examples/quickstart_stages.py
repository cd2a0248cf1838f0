"""Stage factories and hooks used by the documentation (README.md and docs/).

A stage names its factory and hooks by dotted path
(``"examples.quickstart_stages.create_tokenize"``), not by object: the
scheduler is built where the stage runs. Every Python snippet in the docs
uses the factories below, so the docs stay runnable (``tests/test_docs.py``
runs them). Nothing here imports torch at module level, so the snippets
start fast; the tensor stages import it where they run.

Pipelines built from these pieces:

* text: ``tokenize -> embed``;
* streaming speech: ``talker --stream--> vocoder`` (the vocoder is terminal), the talker either a
  generator compute function (``create_generator_talker``) or a hand-written scheduler (``create_talker``);
* omni-modal fan-out/fan-in: ``preprocess -> (text_encoder, image_encoder) -> thinker``;
* a slow stage for abort and deadline demos: ``slow_echo``; an ``async def`` one: ``fetch``;
* tensors between processes: ``pcm_talker --stream--> pcm_vocoder``;
* a stage that takes its whole process down: ``exit_on`` (placement demos only).
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Generator, Sequence

from omni_trio import (
    IncomingMessage,
    OmniRequest,
    OutgoingMessage,
    ReplicaLoad,
    SimpleScheduler,
    StagePayload,
    StreamingSimpleScheduler,
    StreamItem,
)

# ----------------------------------------------------------------------------- text: tokenize -> embed


def tokenize(payload: StagePayload) -> StagePayload:
    """Split the submitted text into tokens; an empty input fails the request."""
    text = payload.data["raw_inputs"]
    if not text.strip():
        raise ValueError("empty input")
    payload.data = {"tokens": text.split()}
    return payload


def create_tokenize() -> SimpleScheduler:
    """The entry stage: the caller's input arrives as ``payload.data["raw_inputs"]``."""
    return SimpleScheduler(tokenize)


def create_embed(dim: int = 2) -> SimpleScheduler:
    """A toy encoder: one ``dim``-sized vector per token (``dim`` comes from ``StageConfig.factory``)."""

    def embed(payload: StagePayload) -> StagePayload:
        tokens = payload.data["tokens"]
        vectors = [[round(ord(c) / 100, 2) for c in token[:dim].ljust(dim, "\0")] for token in tokens]
        payload.data = {"tokens": tokens, "vectors": vectors}
        return payload

    return SimpleScheduler(embed)


# ----------------------------------------------------------------------------- abort and deadline demos


def create_exit_on(word: str = "crash") -> SimpleScheduler:
    """Echoes its input, except that the input ``word`` ends the stage's whole process
    with exit code 3, the way a segfault or an out-of-memory kill would.

    For placement demos: give the stage a ``process`` of its own. In the caller's
    process (``process=None``), ``word`` would end the caller.
    """

    def echo(payload: StagePayload) -> StagePayload:
        if payload.request.inputs == word:
            os._exit(3)
        payload.data = {"echo": payload.request.inputs}
        return payload

    return SimpleScheduler(echo)


def create_speaker(device: str, replica: int) -> SimpleScheduler:
    """For the replicas docs: says which ``device`` (a ``{replica}`` placeholder in the config) and
    which replica (injected, the factory declares it) served each request."""

    def speak(payload: StagePayload) -> StagePayload:
        payload.data = {"words": len(payload.data["tokens"]), "device": device, "replica": replica}
        return payload

    return SimpleScheduler(speak)


class PinnedPolicy:
    """A replica policy for the docs: a request whose metadata names a ``replica`` goes there if it
    can take work; the others go to the least loaded replica (lowest index first)."""

    def choose(self, request_id: str, request: OmniRequest, group: str, replicas: Sequence[ReplicaLoad]) -> int:
        wanted = request.metadata.get("replica")
        if any(replica.index == wanted for replica in replicas):
            return int(wanted)
        return min(replicas, key=lambda replica: (replica.in_flight, replica.index)).index


def create_fetch(concurrency: int = 4) -> SimpleScheduler:
    """An ``async def`` compute that awaits trio (e.g. a call to a remote service): with
    ``run_on_trio_loop=True`` it runs on the stage's trio loop,
    ``concurrency`` requests at a time, and awaits ``request.params["seconds"]``; an abort cancels it."""
    import trio

    async def fetch(payload: StagePayload) -> StagePayload:
        await trio.sleep(float(payload.request.params.get("seconds", 0)))
        payload.data = {"text": str(payload.request.inputs).upper(), "thread": threading.get_ident()}
        return payload

    return SimpleScheduler(fetch, max_concurrency=concurrency, run_on_trio_loop=True)


def create_slow_echo() -> SimpleScheduler:
    """Echoes the input after ``request.params["seconds"]``; an abort ends the wait at once.

    The pattern for long compute: the abort callback (stage thread) sets an
    event that the compute (scheduler thread) checks, as a decoder would
    between steps.
    """
    running: dict[str, threading.Event] = {}
    lock = threading.Lock()

    def echo(payload: StagePayload) -> StagePayload:
        request_id = payload.request_id
        cancelled = threading.Event()
        with lock:
            running[request_id] = cancelled
        if scheduler.is_aborted(request_id):  # aborted between the scheduler's check and here
            cancelled.set()
        try:
            cancelled.wait(float(payload.request.params.get("seconds", 0)))
        finally:
            with lock:
                running.pop(request_id, None)
        payload.data = {"echo": payload.request.inputs}
        return payload

    def on_abort(request_id: str) -> None:
        with lock:
            cancelled = running.get(request_id)
        if cancelled is not None:
            cancelled.set()

    scheduler = SimpleScheduler(echo, abort_callback=on_abort)
    return scheduler


# ----------------------------------------------------------------------------- streaming: talker -> vocoder


def talk(payload: StagePayload) -> Generator[list[int], None, StagePayload]:
    """Per request, yield ``steps`` chunks of codec codes, then return the result.

    Each ``yield`` goes out at once as a stream chunk of the request (to the
    stage's ``stream_to`` stages); the return value is the request's result.
    """
    steps = int(payload.request.params.get("steps", 3))
    for step in range(steps):
        yield [10 * step + 1, 10 * step + 2]  # one decode step's codec codes
    payload.data = {"steps": steps}
    return payload


def create_generator_talker() -> SimpleScheduler:
    """The talker as a generator compute function: a streaming stage with no scheduler of its own."""
    return SimpleScheduler(talk)


class Talker:
    """A hand-written scheduler: per request, stream ``steps`` chunks of codec codes, then the result.

    It blocks on ``inbox.get()`` without a timeout; ``stop()`` wakes it with
    the ``wakeup`` sentinel. ``abort()`` only has to stop the request being
    computed: the stage already removed the request's queued messages from
    the inbox and drops whatever it still outputs.
    """

    def __init__(self, steps: int = 3) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()
        self.steps = steps
        self._lock = threading.Lock()
        self._current: str | None = None
        self._cancelled = False

    def warm_up_serving_thread(self) -> None:
        """Runs once on the scheduler thread before the stage is ready: load weights here."""

    def start(self) -> None:
        """The serve loop, on the scheduler thread."""
        while True:
            msg = self.inbox.get()  # blocks; no timeout, no polling
            if msg.type == "wakeup":  # the sentinel that stop() puts in
                return
            if msg.type == "new_request":
                self._serve(msg.request_id, msg.data)

    def _serve(self, request_id: str, payload: StagePayload) -> None:
        with self._lock:
            self._current, self._cancelled = request_id, False
        try:
            steps = int(payload.request.params.get("steps", self.steps))
            for step in range(steps):
                with self._lock:
                    if self._cancelled:
                        return
                codes = [10 * step + 1, 10 * step + 2]  # one decode step's codec codes
                self.outbox.put(OutgoingMessage(request_id, "stream", data=codes, metadata={"step": step}))
            payload.data = {"steps": steps}
            self.outbox.put(OutgoingMessage(request_id, "result", data=payload))
        except Exception as exc:  # noqa: BLE001 - an error fails only this request
            self.outbox.put(OutgoingMessage(request_id, "error", data=exc))
        finally:
            with self._lock:
                self._current = None

    def stop(self) -> None:
        """Wake a blocked ``start`` so it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Called on the stage's trio thread: quick and thread-safe."""
        with self._lock:
            if request_id == self._current:
                self._cancelled = True


def create_talker(steps: int = 3) -> Talker:
    """Streams ``steps`` chunks per request (``request.params["steps"]`` overrides it)."""
    return Talker(steps)


class Vocoder(StreamingSimpleScheduler):
    """Decodes each chunk of codes into 'audio' as it arrives and streams it on."""

    def __init__(self) -> None:
        super().__init__(compute_fn=None)
        self.samples: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True  # every request's input arrives as a stream

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        audio = [code * 100 for code in item.data]
        self.samples[request_id] = self.samples.get(request_id, 0) + len(audio)
        return [OutgoingMessage(request_id, "stream", data=audio, metadata={"modality": "audio"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"samples": self.samples.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.samples.pop(request_id, None)


def create_vocoder() -> Vocoder:
    """The terminal stage of the speech pipeline."""
    return Vocoder()


# ----------------------------------------------------------------------------- omni-modal fan-out / fan-in


def create_preprocess() -> SimpleScheduler:
    """Splits a request into its modalities: the text input, and ``params["image"]`` if any."""

    def preprocess(payload: StagePayload) -> StagePayload:
        payload.data = {"text": payload.data["raw_inputs"], "image": payload.request.params.get("image")}
        return payload

    return SimpleScheduler(preprocess)


def modalities(payload: StagePayload) -> list[str]:
    """The encoders a request needs: always the text encoder, the image encoder only with an image."""
    return ["image_encoder", "text_encoder"] if payload.request.params.get("image") else ["text_encoder"]


def route_modalities(request_id: str, payload: StagePayload) -> list[str]:
    """``route_fn`` of ``preprocess``: send each request only to the encoders it needs."""
    return modalities(payload)


def expected_modalities(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """``wait_for_fn`` of ``thinker``: wait for the same encoders that ``route_modalities`` chose."""
    return modalities(payload)


def to_text_encoder(payload: StagePayload) -> StagePayload:
    """``project_payload`` for ``text_encoder``: only the text, in a fresh payload (isolated)."""
    return StagePayload(payload.request_id, payload.request, {"text": payload.data["text"]})


def to_image_encoder(payload: StagePayload) -> StagePayload:
    """``project_payload`` for ``image_encoder``: only the image, in a fresh payload (isolated)."""
    return StagePayload(payload.request_id, payload.request, {"image": payload.data["image"]})


def create_text_encoder() -> SimpleScheduler:
    """A toy text encoder: counts tokens."""

    def encode(payload: StagePayload) -> StagePayload:
        payload.data = {"text_tokens": len(payload.data["text"].split())}
        return payload

    return SimpleScheduler(encode)


def create_image_encoder(patches: int = 16) -> SimpleScheduler:
    """A toy image encoder: every image becomes ``patches`` patches."""

    def encode(payload: StagePayload) -> StagePayload:
        payload.data = {"image_patches": patches}
        return payload

    return SimpleScheduler(encode)


def merge_encodings(inputs: dict[str, StagePayload]) -> StagePayload:
    """``merge_fn`` of ``thinker``: ``inputs`` maps source stage -> payload, in arrival order.

    Arrival order varies from run to run, so look sources up by name.
    """
    first = next(iter(inputs.values()))
    data: dict[str, object] = {"sources": sorted(inputs)}
    for name in sorted(inputs):
        data.update(inputs[name].data)
    return StagePayload(first.request_id, first.request, data)


def create_thinker() -> SimpleScheduler:
    """The terminal stage: answers with what it was given."""

    def think(payload: StagePayload) -> StagePayload:
        parts = [f"{key}={value}" for key, value in payload.data.items() if key != "sources"]
        payload.data = {"answer": ", ".join(parts), "sources": payload.data["sources"]}
        return payload

    return SimpleScheduler(think)


# ----------------------------------------------------------------------------- tensors between processes


class PcmTalker:
    """A talker whose chunks are float32 "audio" tensors: one chunk per entry of
    ``request.params["samples"]``, of that many samples, then the result.

    torch is imported on the scheduler thread, so only a process that runs
    this stage imports it.
    """

    def __init__(self) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox: queue.Queue[OutgoingMessage] = queue.Queue()

    def warm_up_serving_thread(self) -> None:
        """Nothing to load."""

    def start(self) -> None:
        """The serve loop: one request at a time, each streamed to the end."""
        import torch

        while True:
            msg = self.inbox.get()
            if msg.type == "wakeup":
                return
            if msg.type == "new_request":
                sizes = msg.data.request.params.get("samples", [160])
                for size in sizes:
                    chunk = torch.zeros(int(size), dtype=torch.float32)
                    self.outbox.put(OutgoingMessage(msg.request_id, "stream", data=chunk))
                msg.data.data = {"chunks": len(sizes)}
                self.outbox.put(OutgoingMessage(msg.request_id, "result", data=msg.data))

    def stop(self) -> None:
        """Wake a blocked ``start`` so it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Nothing to cut short: a request is streamed in one go."""


def create_pcm_talker() -> PcmTalker:
    """Streams float32 tensors (see :class:`PcmTalker`)."""
    return PcmTalker()


class PcmVocoder(StreamingSimpleScheduler):
    """Counts the samples of the talker's tensor chunks; completes with the total."""

    def __init__(self) -> None:
        super().__init__(compute_fn=None)
        self.samples: dict[str, int] = {}

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        self.samples[request_id] = self.samples.get(request_id, 0) + item.data.numel()
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        payload = self.stream_payloads[request_id]
        payload.data = {"samples": self.samples.pop(request_id, 0)}
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.samples.pop(request_id, None)


def create_pcm_vocoder() -> PcmVocoder:
    """The terminal stage of the tensor pipeline: returns ``{"samples": total}``."""
    return PcmVocoder()
