"""Audio on the wire: float samples to PCM16 little-endian, WAV headers, WAV decoding."""

from __future__ import annotations

import io
import struct
import wave
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The RIFF and data sizes of a WAV whose length is not known when its header is sent.
_UNKNOWN_SIZE = 0xFFFFFFFF


def pcm16(samples: torch.Tensor) -> bytes:
    """Float samples in [-1, 1] (clamped) as mono PCM16 little-endian bytes."""
    import torch  # omni_trio itself does not import torch; this runs only where tensors exist

    ints = (samples.detach().reshape(-1).to(torch.float32).clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    return ints.numpy().astype("<i2").tobytes()


def wav_header(sample_rate: int, data_bytes: int | None = None) -> bytes:
    """A 44-byte PCM16 mono WAV header; ``data_bytes=None`` for a stream of unknown length."""
    data = _UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff = _UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF" + struct.pack("<I", riff) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data" + struct.pack("<I", data)
    )


def decode_wav(data: bytes) -> tuple[torch.Tensor, int]:
    """A PCM16 WAV file as float32 mono samples in [-1, 1] and its sample rate (channels are averaged)."""
    import torch

    with wave.open(io.BytesIO(data), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"expected 16-bit PCM WAV, got {8 * wav.getsampwidth()}-bit samples")
        channels, rate = wav.getnchannels(), wav.getframerate()
        frames = wav.readframes(wav.getnframes())
    ints = torch.frombuffer(bytearray(frames), dtype=torch.int16).to(torch.float32) / 32768.0
    return ints.reshape(-1, channels).mean(dim=1), rate


def resample(samples: torch.Tensor, from_rate: int, to_rate: int) -> torch.Tensor:
    """Linear-interpolation resampling (enough for feature extraction, not for listening)."""
    import torch

    if from_rate == to_rate or samples.numel() == 0:
        return samples
    length = max(1, round(samples.numel() * to_rate / from_rate))
    return torch.nn.functional.interpolate(
        samples[None, None, :], size=length, mode="linear", align_corners=False
    )[0, 0].contiguous()


def wav_pcm16(data: bytes) -> tuple[bytes, int]:
    """A PCM16 WAV file as mono PCM16 little-endian bytes (channels averaged) and its sample rate.

    Raises ``ValueError`` (or ``wave.Error``, a subclass of ``Exception``) naming what is wrong with the file.
    """
    import numpy as np

    with wave.open(io.BytesIO(data), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise ValueError(f"expected 16-bit PCM WAV, got {8 * wav.getsampwidth()}-bit samples")
        channels, rate = wav.getnchannels(), wav.getframerate()
        frames = wav.readframes(wav.getnframes())
    if channels == 1:
        return frames, rate
    samples = np.frombuffer(frames, dtype="<i2").reshape(-1, channels).mean(axis=1)
    return samples.round().astype("<i2").tobytes(), rate
