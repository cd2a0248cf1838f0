"""Stage factories for docs/zero-copy.md: a synthesizer that builds its output with ``ot.empty``
and a meter that reads it in another process.

``synth`` writes a 440 Hz tone of the request's ``seconds`` (24 kHz float32) straight into
``ot.empty``; ``meter`` reports how many samples arrived, their peak, and whether the memory it
reads is a shared-memory segment (``/dev/shm``) rather than a private copy. Both say where
their tensor lives, read from ``/proc/self/maps`` (Linux).
"""

from __future__ import annotations

import math

import omni_trio as ot
from omni_trio import SimpleScheduler, StagePayload

RATE = 24_000


def mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process ("" for ordinary memory)."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 else ""
    return ""


def synth(payload: StagePayload) -> StagePayload:
    """A tone of ``seconds`` (request param), computed into ``ot.empty``."""
    import torch

    samples = int(payload.request.params["seconds"] * RATE)
    wave = ot.empty(samples, dtype=torch.float32)
    torch.arange(samples, dtype=torch.float32, out=wave)
    wave.mul_(2 * math.pi * 440 / RATE).sin_()
    payload.data = {"pcm": wave, "built_in_shm": mapped_file(wave.data_ptr()).startswith("/dev/shm/")}
    return payload


def create_synth() -> SimpleScheduler:
    """:func:`synth` on the scheduler thread (the default)."""
    return SimpleScheduler(synth)


def meter(payload: StagePayload) -> StagePayload:
    """Samples, peak and where the received memory lives."""
    pcm = payload.data["pcm"]
    payload.data = {
        "samples": int(pcm.numel()),
        "peak": round(float(pcm.abs().max()), 3),
        "built_in_shm": payload.data["built_in_shm"],
        "read_from_shm": mapped_file(pcm.data_ptr()).startswith("/dev/shm/"),
    }
    return payload


def create_meter() -> SimpleScheduler:
    """:func:`meter` on the scheduler thread."""
    return SimpleScheduler(meter)
