"""The server's voice-activity detector (``turn_detection: server_vad``): energy and flatness, with hysteresis.

A 20 ms frame is speech-like when its level is above a threshold and its
spectrum is far from flat (voiced speech has harmonics; noise is flat), the
measure the demo's ASR gate uses too. Speech starts after ``onset_ms`` of
speech-like frames in a row and stops after ``silence_duration_ms`` of frames
that are not, which bridges unvoiced consonants and the gaps between words.
"""

from __future__ import annotations

import numpy as np

FRAME_MS = 20
#: The flatness (geometric over arithmetic mean of the power spectrum) below which a frame sounds voiced:
#: white noise is about 0.57, voiced speech mostly under 0.05.
MAX_FLATNESS = 0.3


def level_db(threshold: float) -> float:
    """The frame level (dBFS) that OpenAI's ``threshold`` (0 to 1, default 0.5) asks for: -60 to -30 dBFS."""
    return -60.0 + 30.0 * threshold


class VoiceActivity:
    """Feed PCM16 mono; get ``("start", ms)`` and ``("stop", ms)`` events on the audio's own timeline."""

    def __init__(self, sample_rate: int, *, threshold: float = 0.5, silence_duration_ms: int = 500,
                 onset_ms: int = 60) -> None:
        self.frame = sample_rate * FRAME_MS // 1000
        self.min_level_db = level_db(threshold)
        self.onset_frames = max(1, onset_ms // FRAME_MS)
        self.hangover_frames = max(1, silence_duration_ms // FRAME_MS)
        self.in_speech = False
        self._run = 0  # speech-like frames in a row (outside speech), or quiet ones (inside)
        self._frames_seen = 0
        #: Bytes fed so far: where the next ``feed``'s audio starts on the timeline of its events.
        self.bytes_fed = 0
        self._pending = b""
        self._window = np.hanning(self.frame)
        # 100 Hz to 4 kHz: where voiced speech has its harmonics.
        hz = np.fft.rfftfreq(self.frame, 1.0 / sample_rate)
        self._band = (hz >= 100) & (hz <= 4000)

    def speech_like(self, frame: np.ndarray) -> bool:
        """Whether one frame (float samples in [-1, 1]) is loud and far from flat."""
        if 10.0 * np.log10(np.mean(frame * frame) + 1e-12) < self.min_level_db:
            return False
        power = np.abs(np.fft.rfft(frame * self._window))[self._band] ** 2 + 1e-20
        return bool(np.exp(np.mean(np.log(power))) / np.mean(power) < MAX_FLATNESS)

    def feed(self, pcm: bytes) -> list[tuple[str, int]]:
        """The speech starts and stops in ``pcm`` (the ms is where the frame that decided it begins)."""
        self.bytes_fed += len(pcm)
        data = self._pending + pcm
        whole = len(data) // (2 * self.frame) * 2 * self.frame
        self._pending = data[whole:]
        samples = np.frombuffer(data[:whole], dtype="<i2").astype(np.float64) / 32768.0
        events = []
        for frame in samples.reshape(-1, self.frame):
            like = self.speech_like(frame)
            self._frames_seen += 1
            at_ms = (self._frames_seen - 1) * FRAME_MS
            if not self.in_speech:
                self._run = self._run + 1 if like else 0
                if self._run >= self.onset_frames:
                    self.in_speech, self._run = True, 0
                    events.append(("start", at_ms - (self.onset_frames - 1) * FRAME_MS))
            else:
                self._run = 0 if like else self._run + 1
                if self._run >= self.hangover_frames:
                    self.in_speech, self._run = False, 0
                    events.append(("stop", at_ms))
        return events
