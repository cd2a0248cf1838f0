"""Stage factories for the pooled shared-memory tests (imported by dotted path by workers)."""

from __future__ import annotations

from typing import Any

from examples.zero_copy_stages import mapped_file
from omni_trio import SimpleScheduler, StagePayload


def create_filled_tensor() -> SimpleScheduler:
    """Returns ``{"t": torch.full((numel,), fill)}`` for the request's ``numel`` and ``fill`` params."""
    import torch

    def fn(payload: StagePayload) -> StagePayload:
        params = payload.request.params
        payload.data = {"t": torch.full((int(params["numel"]),), float(params["fill"]), dtype=torch.float32)}
        return payload

    return SimpleScheduler(fn)


def create_holding_sink() -> SimpleScheduler:
    """Keeps the tensor of a request whose ``hold`` param is set, until one with ``drop`` set.

    Each result reports what the request's tensor holds (``first``, ``last``),
    where its memory is (``mapped``: the file mapped at its address, a
    ``/dev/shm/...`` path for a zero-copy receive), and the held tensor's
    ``held_sum`` (None when none is held). It writes into each tensor it does
    not hold after reading it (receivers may).
    """
    held: list[Any] = []

    def fn(payload: StagePayload) -> StagePayload:
        params = payload.request.params
        t = payload.data["t"]
        result: dict[str, Any] = {
            "first": float(t[0]),
            "last": float(t[-1]),
            "mapped": mapped_file(t.data_ptr()),
        }
        if params.get("hold"):
            held.append(t)
        else:
            t.fill_(-1.0)  # a receiver may write into what it received
        if params.get("drop"):
            held.clear()
        del t
        result["held_sum"] = float(sum(float(h.sum()) for h in held)) if held else None
        payload.data = result
        return payload

    return SimpleScheduler(fn)
