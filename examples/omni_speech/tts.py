"""A real voice: espeak-ng (see :mod:`examples.omni_speech.espeak`), its audio streamed as it is made.

:class:`TtsScheduler` speaks each request's text and streams every piece of
audio espeak hands its callback (100 ms each) as a stream chunk
``{"pcm": float32 tensor, "sample_rate": 22050}`` with modality ``audio``, so
the consumer knows the rate before the result arrives; the result is
``{"text", "samples", "sample_rate", "chunks", ...}`` (the input's other
fields pass through). ``params["voice"]`` (an espeak-ng voice name, default
``en-us``) and ``params["speed"]`` (1.0 is :data:`WORDS_PER_MINUTE`) choose
how it sounds.
"""

from __future__ import annotations

import collections
import queue
import threading

import numpy as np
import torch

from examples.omni_speech import espeak
from omni_trio import IncomingMessage, Outbox, OutgoingMessage, StagePayload

DEFAULT_VOICE = "en-us"
#: Speed 1.0. With a 100 ms gap between words this is what pocketsphinx recognised best here
#: (word recall 0.80 over six sentences, against 0.09-0.54 at 120-160 wpm without the gap).
WORDS_PER_MINUTE = 150
WORD_GAP_MS = 100


def speech_text(payload: StagePayload) -> str:
    """What to say: the input's ``text`` (e.g. the responder's answer), else the request's raw text."""
    data = payload.data
    text = data.get("text", data.get("raw_inputs")) if isinstance(data, dict) else data
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the TTS stage needs some text to speak")
    return text


class TtsScheduler:
    """One request at a time (espeak-ng is one synthesizer per process), its audio streamed as it is made.

    The scheduler protocol by hand, as the thinker's: ``start`` blocks on
    ``inbox.get()`` and speaks each request; espeak's callback puts every
    chunk on the outbox at once. ``abort`` marks a request: the callback then
    stops the synthesis, and a request not started yet is skipped.
    """

    #: Aborted ids remembered (a request may be aborted before its message is taken).
    MAX_ABORTED = 1024

    def __init__(self, words_per_minute: int = WORDS_PER_MINUTE, word_gap_ms: int = WORD_GAP_MS) -> None:
        self.inbox: queue.Queue[IncomingMessage] = queue.Queue()
        self.outbox = Outbox()
        self.words_per_minute = words_per_minute
        self.word_gap_ms = word_gap_ms
        self._aborted: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def warm_up_serving_thread(self) -> None:
        """Load espeak-ng and its voice before the first request."""
        espeak.synthesize("ready", lambda samples: True, voice=DEFAULT_VOICE)

    def start(self) -> None:
        """The serve loop (scheduler thread)."""
        while True:
            msg = self.inbox.get()  # blocks: no timeout
            if msg.type == "wakeup":
                return
            if msg.type == "new_request" and not self._is_aborted(msg.request_id):
                self._speak(msg.request_id, msg.data)

    def stop(self) -> None:
        """Wake a blocked ``start`` so it returns."""
        self.inbox.put(IncomingMessage("", "wakeup"))

    def abort(self, request_id: str) -> None:
        """Called on the stage's trio thread: the request's synthesis stops at its next chunk."""
        with self._lock:
            self._aborted[request_id] = None
            while len(self._aborted) > self.MAX_ABORTED:
                self._aborted.popitem(last=False)

    def _is_aborted(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._aborted

    def _speak(self, request_id: str, payload: StagePayload) -> None:
        rate = espeak.sample_rate()
        sent = {"chunks": 0, "samples": 0}

        def on_chunk(samples: np.ndarray) -> bool:
            if self._is_aborted(request_id):
                return False
            pcm = torch.from_numpy(samples.astype(np.float32) / 32768.0)
            self.outbox.put(OutgoingMessage(request_id, "stream", data={"pcm": pcm, "sample_rate": rate},
                                            metadata={"modality": "audio"}))
            sent["chunks"] += 1
            sent["samples"] += samples.size
            return True

        try:
            params = payload.request.params
            text = speech_text(payload)
            speed = float(params.get("speed", 1.0))
            if not 0.25 <= speed <= 4.0:
                raise ValueError(f"speed must be between 0.25 and 4.0, got {speed}")
            finished = espeak.synthesize(text, on_chunk, voice=str(params.get("voice", DEFAULT_VOICE)),
                                         words_per_minute=round(self.words_per_minute * speed),
                                         word_gap_ms=self.word_gap_ms)
        except Exception as exc:  # noqa: BLE001 - fails only this request
            self.outbox.put(OutgoingMessage(request_id, "error", data=exc))
            return
        if not finished:
            return  # aborted: the stage drops the request
        extra = payload.data if isinstance(payload.data, dict) else {}
        payload.data = {**extra, "text": text, "sample_rate": rate, **sent}
        payload.data.pop("raw_inputs", None)
        self.outbox.put(OutgoingMessage(request_id, "result", data=payload))


def create_tts(words_per_minute: int = WORDS_PER_MINUTE, word_gap_ms: int = WORD_GAP_MS) -> TtsScheduler:
    """The espeak-ng TTS stage: text in, PCM chunks streamed out as they are made."""
    return TtsScheduler(words_per_minute, word_gap_ms)
