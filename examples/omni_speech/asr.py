"""Speech recognition with pocketsphinx (its bundled en-us model: nothing is downloaded).

* :class:`SpeechGate`: the voice-activity detector. pocketsphinx alone turns
  digital silence into a word, and the WebRTC VAD that pocketsphinx ships
  (``pocketsphinx.Vad``, also PyPI's ``webrtcvad``) calls white noise speech
  in every frame, so the gate is written here: a 30 ms frame is speech-like
  when it is loud enough *and* its spectrum is far from flat (voiced speech
  has harmonics; white noise has a flat spectrum), with hysteresis;
* :class:`Recognizer`: one utterance stream: any rate in (``soxr`` resamples
  to 16 kHz with a proper low-pass), the gate, the decoder; ``feed`` gives the
  transcript so far as it changes, ``finish`` the final one;
* :func:`create_asr`: the request stage (``params["audio_pcm"]`` and
  ``params["sample_rate"]`` in, ``{"transcript": ...}`` out);
* :func:`create_asr_sessions`: the streaming stage, one recognizer per
  session, partial transcripts emitted as stream chunks (see examples/realtime_asr.py).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np
import soxr
import torch
from pocketsphinx import Decoder

import omni_trio as ot
from examples.omni_speech import espeak, tts

SAMPLE_RATE = 16_000  # the acoustic model's rate
FRAME = 480  # 30 ms at 16 kHz: the gate's unit
#: Decoder settings: no second (flat-lexicon) pass, which here was both faster and more accurate on
#: espeak-ng's voice (word recall 0.80 against 0.66 over six sentences), and a tighter search.
DECODER_OPTIONS: dict[str, Any] = {"fwdflat": False, "maxhmmpf": 3000, "pl_window": 5, "loglevel": "FATAL"}


def pcm16(samples: Any, sample_rate: int) -> np.ndarray:
    """Mono samples (float in [-1, 1] or int16; array, tensor or list) as int16 at 16 kHz."""
    resampler = Resampler(sample_rate)
    return resampler.push(samples, last=True)


class Resampler:
    """Streaming conversion to int16 at 16 kHz: ``soxr``'s windowed-sinc low-pass, state kept across chunks."""

    def __init__(self, sample_rate: int) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.stream = None if sample_rate == SAMPLE_RATE else soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1,
                                                                                    dtype="float32")

    def push(self, samples: Any, last: bool = False) -> np.ndarray:
        """The next int16 samples at 16 kHz (``last`` flushes the filter's tail)."""
        data = samples.numpy() if isinstance(samples, torch.Tensor) else np.asarray(samples)
        data = data.reshape(-1)
        floats = data.astype(np.float32) / 32768.0 if data.dtype == np.int16 else data.astype(np.float32)
        if self.stream is not None:
            floats = self.stream.resample_chunk(floats, last=last)
        return (np.clip(floats, -1.0, 32767 / 32768) * 32768.0).round().astype(np.int16)


class SpeechGate:
    """Energy and spectral flatness per 30 ms frame, with hysteresis.

    A frame is speech-like when its level is above ``min_level_db`` (dBFS)
    and its spectral flatness over 100-4000 Hz (geometric over arithmetic
    mean of the power spectrum: about 0.57 for white noise, under 0.05 for
    most voiced speech) is below ``max_flatness``. Speech starts after
    ``onset_frames`` speech-like frames in a row and ends after
    ``hangover_frames`` frames that are not (which bridges unvoiced consonants
    and short pauses).
    """

    def __init__(self, min_level_db: float = -45.0, max_flatness: float = 0.3, onset_frames: int = 3,
                 hangover_frames: int = 20) -> None:
        self.min_level_db = min_level_db
        self.max_flatness = max_flatness
        self.onset_frames = onset_frames
        self.hangover_frames = hangover_frames
        self.in_speech = False
        self._run = 0  # speech-like frames in a row (outside speech), or quiet ones (inside)
        self._window = np.hanning(FRAME)

    def speech_like(self, frame: np.ndarray) -> bool:
        """Whether one frame (int16, :data:`FRAME` samples) is loud and far from flat."""
        x = frame.astype(np.float64) / 32768.0
        if 10.0 * np.log10(np.mean(x * x) + 1e-12) < self.min_level_db:
            return False
        power = np.abs(np.fft.rfft(x * self._window)) ** 2 + 1e-20
        band = power[3:121]  # 100 Hz to 4 kHz, 33.3 Hz a bin
        flatness = np.exp(np.mean(np.log(band))) / np.mean(band)
        return bool(flatness < self.max_flatness)

    def update(self, frame: np.ndarray) -> str:
        """``"start"``, ``"speech"``, ``"end"`` or ``"silence"`` for the next frame."""
        like = self.speech_like(frame)
        if not self.in_speech:
            self._run = self._run + 1 if like else 0
            if self._run >= self.onset_frames:
                self.in_speech, self._run = True, 0
                return "start"
            return "silence"
        self._run = 0 if like else self._run + 1
        if self._run >= self.hangover_frames:
            self.in_speech, self._run = False, 0
            return "end"
        return "speech"


class DecoderPool:
    """Idle pocketsphinx decoders (loading one takes most of a second), shared by a stage's recognizers."""

    def __init__(self) -> None:
        self._idle: list[Decoder] = []
        self._lock = threading.Lock()
        self._cmn_start: str | None = None  # where every segment's live cepstral mean starts, once set

    def take(self) -> Decoder:
        """An idle decoder, or a new one, its cepstral mean at the pool's starting point (once set)."""
        with self._lock:
            decoder = self._idle.pop() if self._idle else None
            start = self._cmn_start
        if decoder is None:
            decoder = Decoder(samprate=SAMPLE_RATE, **DECODER_OPTIONS)
        if start is not None:
            decoder.set_cmn(start)
        return decoder

    def keep_start(self) -> None:
        """Start every later segment's cepstral mean where the decoder given back last left it.

        pocketsphinx updates its live cepstral mean with everything a decoder hears, so without a
        fixed start a segment's transcript depends on what the decoder heard before (other requests,
        in whatever order they came); with it, on its own audio only.
        """
        with self._lock:
            if self._idle:
                self._cmn_start = self._idle[-1].get_cmn(True)

    def give_back(self, decoder: Decoder) -> None:
        """Return a decoder that is between utterances."""
        with self._lock:
            self._idle.append(decoder)


class Recognizer:
    """One audio stream: resampled, gated, decoded; the transcript is the speech segments' words."""

    #: Frames kept from before the gate opens, so a word's first sound is not cut off.
    PREROLL_FRAMES = 10

    def __init__(self, pool: DecoderPool, sample_rate: int = SAMPLE_RATE) -> None:
        self.pool = pool
        self.resampler = Resampler(sample_rate)
        self.gate = SpeechGate()
        self.decoder: Decoder | None = None  # taken while a speech segment is open
        self.pending = np.zeros(0, dtype=np.int16)  # samples of a frame not yet whole
        self.preroll: collections.deque[np.ndarray] = collections.deque(maxlen=self.PREROLL_FRAMES)
        self.segments: list[str] = []
        self.transcript = ""
        self.samples_heard = 0

    def feed(self, samples: Any) -> str | None:
        """Take the next chunk; the transcript so far if it changed, else None."""
        self._frames(self.resampler.push(samples))
        return self._changed()

    def finish(self) -> str:
        """End the stream (the filter's tail, a last partial frame, an open segment): the final transcript."""
        self._frames(self.resampler.push(np.zeros(0, dtype=np.float32), last=True))
        if self.pending.size:
            self._frames(np.zeros(FRAME - self.pending.size, dtype=np.int16))
        if self.decoder is not None:
            self._end_segment()
        self._changed()
        return self.transcript

    def release(self) -> None:
        """Give the decoder back (at the end, or when the stream is dropped mid-segment)."""
        if self.decoder is not None:
            self.decoder.end_utt()
            self.pool.give_back(self.decoder)
            self.decoder = None

    def _frames(self, samples: np.ndarray) -> None:
        self.samples_heard += samples.size
        samples = np.concatenate([self.pending, samples])
        whole = samples.size // FRAME * FRAME
        self.pending = samples[whole:]
        for frame in samples[:whole].reshape(-1, FRAME):
            event = self.gate.update(frame)
            if event == "start":
                self.decoder = self.pool.take()
                self.decoder.start_utt()
                for earlier in self.preroll:
                    self.decoder.process_raw(earlier.tobytes(), False, False)
                self.preroll.clear()
            if self.decoder is not None:
                self.decoder.process_raw(frame.tobytes(), False, False)
                if event == "end":
                    self._end_segment()
            else:
                self.preroll.append(frame)

    def _end_segment(self) -> None:
        assert self.decoder is not None
        self.decoder.end_utt()
        hypothesis = self.decoder.hyp()
        if hypothesis is not None and hypothesis.hypstr:
            self.segments.append(hypothesis.hypstr)
        self.pool.give_back(self.decoder)
        self.decoder = None

    def _changed(self) -> str | None:
        words = list(self.segments)
        if self.decoder is not None:
            hypothesis = self.decoder.hyp()
            if hypothesis is not None and hypothesis.hypstr:
                words.append(hypothesis.hypstr)
        text = " ".join(words)
        if text == self.transcript:
            return None
        self.transcript = text
        return text


#: What a stage's decoders hear before any request: a few sentences in the demo voice's manner.
WARM_UP_TEXT = ("hello there, how are you today. please turn on the radio. we will meet at the station "
                "at noon. the children are playing outside in the garden.")


def _warm_up(pool: DecoderPool) -> None:
    """Load a decoder into the pool, let it hear :data:`WARM_UP_TEXT`, and start every segment from there.

    Besides making the first request fast, this fixes where each segment's live cepstral mean starts
    (:meth:`DecoderPool.keep_start`): from a voice rather than from the model's defaults, and the same
    for every request, so that a transcript depends on its own audio only, not on the requests before
    it. Measured on the six sentences of ``tests/speech``: word recall 0.77 from this start, 0.51-0.63
    from one short sentence's, 0.74 when each request started where the one before left off (which also
    made the transcript of the same audio change with the order of requests).
    """
    chunks: list[np.ndarray] = []

    def keep(samples: np.ndarray) -> bool:
        chunks.append(samples)
        return True

    espeak.synthesize(WARM_UP_TEXT, keep, word_gap_ms=tts.WORD_GAP_MS)
    recognizer = Recognizer(pool, espeak.sample_rate())
    recognizer.feed(np.concatenate(chunks))
    recognizer.finish()
    recognizer.release()
    pool.keep_start()


# ------------------------------------------------------------------------------------- stages


class AsrScheduler(ot.SimpleScheduler):
    """A :class:`~omni_trio.SimpleScheduler` over a decoder pool, warmed up before serving."""

    def __init__(self, pool: DecoderPool, **options: Any) -> None:
        super().__init__(self.transcribe, **options)
        self.pool = pool

    def warm_up_serving_thread(self) -> None:
        _warm_up(self.pool)

    def transcribe(self, payload: ot.StagePayload) -> ot.StagePayload:
        """``params["audio_pcm"]`` (at ``params["sample_rate"]``, default 16 kHz) -> ``{"transcript": ...}``.

        A request without audio is typed: its text is the transcript.
        """
        params = payload.request.params
        if params.get("audio_pcm") is None:
            text = payload.data["raw_inputs"] if isinstance(payload.data, dict) else payload.data
            payload.data = {"transcript": str(text or "").strip(), "heard_s": 0.0}
            return payload
        recognizer = Recognizer(self.pool, int(params.get("sample_rate", SAMPLE_RATE)))
        try:
            recognizer.feed(params["audio_pcm"])
            transcript = recognizer.finish()
        finally:
            recognizer.release()
        payload.data = {"transcript": transcript, "heard_s": recognizer.samples_heard / SAMPLE_RATE}
        return payload


def create_asr(max_concurrency: int = 1) -> AsrScheduler:
    """The request ASR stage: a whole utterance in, its transcript out (``max_concurrency`` decoders at once)."""
    return AsrScheduler(DecoderPool(), max_concurrency=max_concurrency)


class StreamingRecognizer:
    """Session hooks: one :class:`Recognizer` per session, each changed partial transcript emitted.

    Every append feeds one chunk: samples at 16 kHz, or
    ``{"pcm": samples, "sample_rate": rate}`` (the session's first chunk sets
    its rate). An empty chunk ends the stream: the final transcript is emitted
    (with ``"final": True`` in the chunk's dict) and the session starts over.
    """

    def __init__(self, pool: DecoderPool) -> None:
        self.pool = pool
        self.recognizers: dict[str, Recognizer | None] = {}
        self.rates: dict[str, int] = {}

    def warm_up_serving_thread(self) -> None:
        """Load a decoder before the first session needs one."""
        _warm_up(self.pool)

    def open(self, session_id: str, request: ot.OmniRequest) -> None:
        """The session's recognizer starts with its first chunk, which gives the rate."""
        self.recognizers[session_id] = None

    def append(self, chunk: Any, payload: ot.StagePayload, context: ot.SessionContext) -> ot.StagePayload:
        """Feed one chunk; emit the transcript so far when it changed (the final one on an empty chunk)."""
        samples, rate = (chunk["pcm"], int(chunk["sample_rate"])) if isinstance(chunk, dict) else (chunk, SAMPLE_RATE)
        if self.rates.setdefault(context.session_id, rate) != rate:
            raise ValueError(f"the session's audio is at {self.rates[context.session_id]} Hz, this chunk at {rate}")
        recognizer = self.recognizers[context.session_id] or Recognizer(self.pool, rate)
        self.recognizers[context.session_id] = recognizer
        final = np.asarray(samples).size == 0
        if final:
            text: str | None = recognizer.finish()
            recognizer.release()
            self.recognizers[context.session_id] = None
        else:
            text = recognizer.feed(samples)
        heard_ms = 1000.0 * recognizer.samples_heard / SAMPLE_RATE
        if (text is not None or final) and not context.cancelled.is_set():
            context.emit({**ot.TimedChunk(recognizer.transcript, end_ms=heard_ms).to_dict(), "final": final})
        payload.data = {"transcript": recognizer.transcript, "final": final}
        return payload

    def close(self, session_id: str) -> None:
        """Drop the session's recognizer (its decoder goes back to the pool)."""
        recognizer = self.recognizers.pop(session_id, None)
        self.rates.pop(session_id, None)
        if recognizer is not None:
            recognizer.release()

    def state_bytes(self, session_id: str) -> int:
        """The samples held for an unfinished frame (the decoder is pooled, not counted)."""
        recognizer = self.recognizers.get(session_id)
        return 0 if recognizer is None else recognizer.pending.nbytes


def create_asr_sessions(max_open_sessions: int = 16) -> ot.SessionScheduler:
    """The streaming ASR stage: one recognizer per session, partial transcripts streamed."""
    return ot.SessionScheduler(StreamingRecognizer(DecoderPool()), max_open_sessions=max_open_sessions)
