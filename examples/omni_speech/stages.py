"""Stage factories, schedulers and hooks of the omni_speech pipeline.

::

    preprocess ─┬─► text_encoder ──┬─► thinker ══tokens══► talker ══frames══► vocoder ══PCM══► caller
                └─► audio_encoder ─┘   (fan-in)   (stream)          (stream)           (stream)

Each factory builds its model from a fixed seed (same weights in every
process) and limits torch to one thread (``torch.set_num_threads(1)``), both
in the factory and on the scheduler thread. A stage names these by dotted
path, e.g. ``"examples.omni_speech.stages.create_thinker"``.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

from examples.omni_speech import models
from omni_trio import (
    BatchedRequest,
    BusyTime,
    ContinuousBatchingScheduler,
    IncomingMessage,
    OmniRequest,
    Outbox,
    OutgoingMessage,
    SimpleScheduler,
    StagePayload,
    StepOutput,
    StreamingSimpleScheduler,
    StreamItem,
)

#: The thinker's default answer length, in tokens (``params["max_new_tokens"]`` overrides it).
MAX_NEW_TOKENS = 24
#: Seeds of the models' random weights.
SEEDS = {"text_encoder": 1, "audio_encoder": 2, "thinker": 3, "talker": 4, "vocoder": 5}


def _one_thread() -> None:
    # Small models: one thread is as fast, keeps CPU use sane and the numerics deterministic.
    torch.set_num_threads(1)


# -------------------------------------------------------------------------------------- routing


def wants_audio(request: OmniRequest) -> bool:
    """Whether a request comes with audio: ``params["audio"]`` (``True`` or a dict for ``synthesize_audio``),
    or ``params["audio_pcm"]`` (float32 samples at 16 kHz, e.g. a client's WAV)."""
    return bool(request.params.get("audio")) or request.params.get("audio_pcm") is not None


def encoders_for(payload: StagePayload) -> list[str]:
    """The encoders a request needs: the text encoder always, the audio encoder only with audio."""
    return ["text_encoder", "audio_encoder"] if wants_audio(payload.request) else ["text_encoder"]


def route_encoders(request_id: str, payload: StagePayload) -> list[str]:
    """``route_fn`` of ``preprocess``: only the encoders this request needs."""
    return encoders_for(payload)


def expected_encoders(request_id: str, from_stage: str, payload: StagePayload) -> list[str]:
    """``wait_for_fn`` of ``thinker``: the same encoders :func:`route_encoders` chose."""
    return encoders_for(payload)


def to_text_encoder(payload: StagePayload) -> StagePayload:
    """``project_payload`` for ``text_encoder``: only the token ids, in a fresh payload."""
    return StagePayload(payload.request_id, payload.request, {"text_ids": payload.data["text_ids"]})


def to_audio_encoder(payload: StagePayload) -> StagePayload:
    """``project_payload`` for ``audio_encoder``: only the log-mel features, in a fresh payload."""
    return StagePayload(payload.request_id, payload.request, {"mel": payload.data["mel"]})


def merge_encodings(inputs: dict[str, StagePayload]) -> StagePayload:
    """``merge_fn`` of ``thinker``: the text encoding, and the audio encoding if the request had audio."""
    text = inputs["text_encoder"]
    audio = inputs.get("audio_encoder")
    data: dict[str, Any] = {"text": text.data["text"], "audio": None, "audio_batch": 0}
    if audio is not None:
        data.update(audio=audio.data["audio"], audio_batch=audio.data["batch_size"])
    return StagePayload(text.request_id, text.request, data)


# ------------------------------------------------------------------------------ simple stages


class ModelScheduler(SimpleScheduler):
    """A :class:`SimpleScheduler` that sets torch up on its thread and warms its model up before serving."""

    def __init__(self, compute_fn: Callable[[Any], Any], warm_up: Callable[[], object], **options: Any) -> None:
        super().__init__(compute_fn, **options)
        self._warm_up = warm_up

    def warm_up_serving_thread(self) -> None:
        _one_thread()
        with torch.no_grad():
            self._warm_up()


def preprocess(payload: StagePayload) -> StagePayload:
    """Text -> byte token ids; ``params["audio_pcm"]`` or ``params["audio"]`` (a synthetic signal) -> log-mel."""
    text = payload.data["raw_inputs"]
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the request needs some text")
    params = payload.request.params
    models.check_voice(params.get("voice", models.DEFAULT_VOICE), params.get("speed", 1.0))
    data: dict[str, Any] = {"text_ids": models.encode_text(text)}
    if params.get("audio_pcm") is not None:
        data["mel"] = models.log_mel(torch.as_tensor(params["audio_pcm"], dtype=torch.float32).contiguous())
    elif wants_audio(payload.request):
        spec = params["audio"]
        wave = models.synthesize_audio(**(spec if isinstance(spec, dict) else {}))
        data["mel"] = models.log_mel(wave)
    payload.data = data
    return payload


def create_preprocess() -> SimpleScheduler:
    """The entry stage (no model)."""
    _one_thread()

    def warm_up() -> None:
        models.log_mel(models.synthesize_audio(0.1))

    return ModelScheduler(preprocess, warm_up)


def create_text_encoder(seed: int = SEEDS["text_encoder"]) -> SimpleScheduler:
    """Token ids -> ``{"text": [T, D] float32}``."""
    _one_thread()
    model = models.seeded(seed, models.TextEncoder)

    def encode(payload: StagePayload) -> StagePayload:
        with torch.no_grad():
            payload.data = {"text": model(payload.data["text_ids"]).contiguous()}
        return payload

    return ModelScheduler(encode, lambda: model(models.encode_text("warm up")))


def create_audio_encoder(
    seed: int = SEEDS["audio_encoder"], max_batch_size: int = 4, max_batch_wait_ms: float = 10.0
) -> SimpleScheduler:
    """Log-mel features -> ``{"audio": [A, D] float32, "batch_size": n}``, requests batched together.

    An idle encoder runs a lone request at once; when a second one joins, it
    waits up to ``max_batch_wait_ms`` for more, up to ``max_batch_size``.
    """
    _one_thread()
    model = models.seeded(seed, models.AudioEncoder)

    def encode_batch(payloads: list[StagePayload]) -> list[StagePayload]:
        mels = [p.data["mel"] for p in payloads]
        lengths = [m.shape[0] for m in mels]
        batch = torch.zeros(len(mels), max(lengths), models.N_MELS)
        for row, mel in enumerate(mels):
            batch[row, : mel.shape[0]] = mel
        with torch.no_grad():
            encoded = model(batch, lengths)
        for row, payload in enumerate(payloads):
            frames = models.AudioEncoder.output_length(lengths[row])
            payload.data = {"audio": encoded[row, :frames].contiguous(), "batch_size": len(payloads)}
        return payloads

    def warm_up() -> None:
        encode_batch([StagePayload("warm-up", OmniRequest(None), {"mel": torch.zeros(50, models.N_MELS)})])

    return ModelScheduler(
        lambda payload: encode_batch([payload])[0],
        warm_up,
        batch_compute_fn=encode_batch,
        max_batch_size=max_batch_size,
        max_batch_wait_ms=max_batch_wait_ms,
    )


# -------------------------------------------------------------------------------------- thinker


class ThinkerScheduler:
    """The thinker: prefill, then greedy decoding with a KV cache, streaming every token as it is made.

    A hand-written scheduler (the protocol: ``inbox``/``outbox`` queues,
    ``warm_up_serving_thread``, ``start``, ``stop``, ``abort``). Several
    requests decode at once, a step each in turn. With nothing to decode the
    loop blocks on ``inbox.get()``; while decoding it only takes what is
    already queued (``get_nowait``) between steps, so it never polls.
    ``stop()`` wakes it with the ``wakeup`` sentinel; ``abort()`` marks a
    request, and the loop drops it before its next step.

    Per step it emits ``OutgoingMessage(rid, "stream", data=<int64 tensor of
    one token>)``, which the stage sends to its ``stream_to`` (the talker);
    the first token's metadata carries the request's ``voice`` and ``speed``
    on to the vocoder. After the last token, the result ``{"tokens": [...], "text": ...}``.
    ``busy`` times its prefills and decode steps (``stats()``'s ``busy_seconds``).
    """

    def __init__(self, model: models.Thinker, max_new_tokens: int = MAX_NEW_TOKENS) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox = Outbox()  # its put wakes the stage: no pump thread
        self.model = model
        self.max_new_tokens = max_new_tokens
        #: Requests decoding here, in turn order, with their payload, state and token budget.
        self._active: collections.OrderedDict[str, tuple[StagePayload, models.Generation, int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        #: Ids aborted while decoding here (cleared when the loop drops them) ...
        self._cancelled: set[str] = set()
        #: ... and ids aborted before they got here, in case the loop already took their message (bounded).
        self._aborted_early: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.busy = BusyTime()

    # ----------------------------------------------------------------- the protocol

    def warm_up_serving_thread(self) -> None:
        """Set torch up on this thread and run one small generation, so the first request is not slow."""
        _one_thread()
        with torch.no_grad():
            state = self.model.prefill(torch.zeros(4, models.D_MODEL), None, 2)
            self.model.step(state)

    def start(self) -> None:
        """The serve loop (scheduler thread)."""
        while True:
            if self._active:
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    self.busy.call(self._step_each)
                    continue
            else:
                msg = self.inbox.get()  # nothing to decode: block, no timeout
            if msg.type == "wakeup":
                return
            if msg.type == "new_request":
                self._admit(msg.request_id, msg.data)

    def stop(self) -> None:
        """Wake a blocked ``start`` so it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Called on the stage's trio thread: mark the request; the loop drops it before its next step."""
        with self._lock:
            if request_id in self._active:
                self._cancelled.add(request_id)
            else:
                self._aborted_early[request_id] = None
                while len(self._aborted_early) > 1024:
                    self._aborted_early.popitem(last=False)

    # ----------------------------------------------------------------- decoding

    def _aborted_before_admission(self, request_id: str) -> bool:
        with self._lock:
            if request_id in self._aborted_early:
                del self._aborted_early[request_id]
                return True
            return False

    def _admit(self, request_id: str, payload: StagePayload) -> None:
        if self._aborted_before_admission(request_id):
            return
        try:
            budget = int(payload.request.params.get("max_new_tokens", self.max_new_tokens))
            if budget < 1:
                raise ValueError(f"max_new_tokens must be at least 1, got {budget}")
            with torch.no_grad():
                state = self.busy.call(self.model.prefill, payload.data["text"], payload.data["audio"], budget)
        except Exception as exc:  # noqa: BLE001 - fails only this request
            self.outbox.put(OutgoingMessage(request_id, "error", data=exc))
            return
        with self._lock:
            # An abort that came during the prefill found the request not active yet: honour it here.
            if request_id in self._aborted_early:
                del self._aborted_early[request_id]
                return
            self._active[request_id] = (payload, state, budget)

    def _step_each(self) -> None:
        """One decode step for every active request, in turn."""
        for request_id in list(self._active):
            with self._lock:
                if request_id in self._cancelled:
                    self._cancelled.discard(request_id)
                    del self._active[request_id]
                    continue
            payload, state, budget = self._active[request_id]
            try:
                with torch.no_grad():
                    token = self.model.step(state)
            except Exception as exc:  # noqa: BLE001 - fails only this request
                self._finish(request_id, OutgoingMessage(request_id, "error", data=exc))
                continue
            chunk = torch.tensor([token], dtype=torch.int64)
            metadata: dict[str, Any] = {"step": len(state.tokens) - 1}
            if metadata["step"] == 0:
                params = payload.request.params
                metadata.update(voice=params.get("voice", models.DEFAULT_VOICE), speed=params.get("speed", 1.0))
            self.outbox.put(OutgoingMessage(request_id, "stream", data=chunk, metadata=metadata))
            if len(state.tokens) >= budget:
                payload.data = {"tokens": list(state.tokens), "text": models.decode_tokens(state.tokens),
                                "audio_batch": payload.data["audio_batch"]}
                self._finish(request_id, OutgoingMessage(request_id, "result", data=payload))

    def _finish(self, request_id: str, message: OutgoingMessage) -> None:
        with self._lock:
            del self._active[request_id]
            self._cancelled.discard(request_id)
        self.outbox.put(message)


def create_thinker(seed: int = SEEDS["thinker"], max_new_tokens: int = MAX_NEW_TOKENS) -> ThinkerScheduler:
    """The thinker: ``max_new_tokens`` greedy tokens per request (``params["max_new_tokens"]`` overrides it)."""
    _one_thread()
    return ThinkerScheduler(models.seeded(seed, models.Thinker), max_new_tokens)


# ------------------------------------------------------------------------------- talker, vocoder


def talk(model: models.Talker, batch: list[BatchedRequest]) -> list[list[StepOutput] | Exception]:
    """One talker step over the batch: each request's new tokens become codec frames; a request whose
    thinker stream ended and whose payload is here ends with ``{..., "frames": n}``."""
    with torch.no_grad():
        return [_talk_one(model, request) for request in batch]


def _talk_one(model: models.Talker, request: BatchedRequest) -> list[StepOutput] | Exception:
    state: models.TalkerState = request.state
    outputs = []
    for item in request.inputs:
        token = int(item.data.reshape(-1)[0])
        state.tokens += 1
        # The voice rides on the request's first frame to the vocoder.
        voice = {key: item.metadata[key] for key in ("voice", "speed") if item.metadata and key in item.metadata}
        for index in range(models.FRAMES_PER_TOKEN):
            codes = model.frame(token, index, state)
            metadata: dict[str, Any] = {"frame": state.frames - 1}
            if index == 0:
                metadata.update(voice)
            outputs.append(StepOutput(chunk=codes, metadata=metadata))
    payload = request.payload
    if request.stream_ended and payload is not None:
        if state.tokens != len(payload.data["tokens"]):
            return RuntimeError(f"talker got {state.tokens} tokens, the thinker made {len(payload.data['tokens'])}")
        payload.data = {**payload.data, "frames": state.frames}
        outputs.append(StepOutput(done=True))
    return outputs


class TalkerScheduler(ContinuousBatchingScheduler):
    """Each token from the thinker becomes :data:`~models.FRAMES_PER_TOKEN` codec frames, streamed on.

    The built-in iteration-level scheduler with stream input: a request joins
    the batch on its first token (tokens come before the thinker's result
    payload: the thinker streams while it decodes), each step turns the new
    tokens of every request in the batch into frames (:func:`talk`), and a
    request ends once the thinker's stream ended and its payload is here.
    """

    def __init__(self, model: models.Talker, max_batch_size: int = 8) -> None:
        super().__init__(functools.partial(talk, model), max_batch_size=max_batch_size,
                         join_fn=lambda request: models.TalkerState(), stream_input=True)
        self.model = model

    def warm_up_serving_thread(self) -> None:
        _one_thread()
        with torch.no_grad():
            self.model.frame(models.BOS, 0, models.TalkerState())


def create_talker(seed: int = SEEDS["talker"], max_batch_size: int = 8) -> TalkerScheduler:
    """Tokens in (stream), codec frames out (stream), then ``{"frames": n, ...}``; up to ``max_batch_size``
    requests step together."""
    _one_thread()
    return TalkerScheduler(models.seeded(seed, models.Talker), max_batch_size)


class VocoderScheduler(StreamingSimpleScheduler):
    """Each codec frame becomes float32 PCM samples, streamed to the caller: :data:`~models.SAMPLES_PER_FRAME`
    of them at speed 1, ``SAMPLES_PER_FRAME / speed`` otherwise, in the voice the request's first frame names."""

    def __init__(self, model: models.Vocoder) -> None:
        super().__init__(compute_fn=None)
        self.model = model
        self.states: dict[str, models.VocoderState] = {}

    def warm_up_serving_thread(self) -> None:
        _one_thread()
        with torch.no_grad():
            self.model.frame(torch.zeros(models.CODEBOOKS, dtype=torch.int64), models.VocoderState())

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return True

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        state = self.states.get(request_id)
        if state is None:
            metadata = item.metadata or {}
            voice, speed = models.check_voice(metadata.get("voice", models.DEFAULT_VOICE), metadata.get("speed", 1.0))
            state = self.states[request_id] = models.VocoderState(
                voice=models.VOICES[voice], frame_samples=models.samples_per_frame(speed)
            )
        with torch.no_grad():
            pcm = self.model.frame(item.data, state)
        return [OutgoingMessage(request_id, "stream", data=pcm, metadata={"modality": "audio"})]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage]:
        state = self.states.pop(request_id, models.VocoderState())
        payload = self.stream_payloads[request_id]
        if state.frames != payload.data["frames"]:
            raise RuntimeError(f"vocoder got {state.frames} frames, the talker made {payload.data['frames']}")
        payload.data = {
            "frames": state.frames,
            "samples": state.samples,
            "sample_rate": models.SAMPLE_RATE,
            "samples_per_frame": state.frame_samples,
            "tokens": len(payload.data["tokens"]),
            "text": payload.data["text"],
            "audio_batch": payload.data["audio_batch"],
        }
        return [OutgoingMessage(request_id, "result", data=payload)]

    def clear_stream_state(self, request_id: str) -> None:
        self.states.pop(request_id, None)


def create_vocoder(seed: int = SEEDS["vocoder"]) -> VocoderScheduler:
    """Codec frames in (stream), PCM out to the caller (stream), then ``{"frames", "samples", ...}``."""
    _one_thread()
    return VocoderScheduler(models.seeded(seed, models.Vocoder))
