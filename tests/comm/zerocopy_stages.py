"""Stage factories for the ``ot.empty`` tests (imported by dotted path by workers)."""

from __future__ import annotations

from typing import Any

import torch

import omni_trio as ot
from examples.zero_copy_stages import mapped_file
from omni_trio import SimpleScheduler, StagePayload, ThreadedSimpleScheduler

_kept: list[torch.Tensor] = []


def create_empty_source(scheduler: str = "simple") -> SimpleScheduler | ThreadedSimpleScheduler:
    """Fills ``ot.empty(numel)`` with ``fill`` and returns it as ``{"t": ...}``.

    Params: ``numel``, ``fill``; ``offset`` sends the slice ``t[offset:]`` (a view); ``keep`` keeps
    the tensor after sending it (later requests report its sum as ``kept_sum``); ``drop_only``
    allocates and drops a tensor without sending it (the result says where it was). ``mapped``
    is the file the tensor's memory is mapped from, as the stage saw it. ``scheduler``: ``simple``
    (the default), ``concurrent`` (``SimpleScheduler(max_concurrency=2)``) or ``threaded``
    (``ThreadedSimpleScheduler``): the last two run ``fn`` on threads of their own.
    """

    def fn(payload: StagePayload) -> StagePayload:
        params = payload.request.params
        numel = int(params["numel"])
        t = ot.empty(numel, dtype=torch.float32)
        t.fill_(float(params.get("fill", 0.0)))
        info: dict[str, Any] = {"src_mapped": mapped_file(t.data_ptr())}
        if params.get("drop_only"):
            del t
            payload.data = info
            return payload
        if params.get("keep"):
            _kept.append(t)
        info["kept_sum"] = float(sum(float(k.sum()) for k in _kept)) if _kept else None
        sent = t[int(params.get("offset", 0)) :]
        info["t"] = sent
        payload.data = info
        return payload

    if scheduler == "threaded":
        return ThreadedSimpleScheduler(fn, max_concurrency=2)
    if scheduler == "concurrent":
        return SimpleScheduler(fn, max_concurrency=2)
    return SimpleScheduler(fn)


def create_reporting_sink() -> SimpleScheduler:
    """Reports what arrived: the tensor's length, sum, first/last element and mapping (or the
    source's result unchanged when it carries no tensor), plus the source's own fields."""

    def fn(payload: StagePayload) -> StagePayload:
        data = dict(payload.data)
        t = data.pop("t", None)
        if t is not None:
            data.update(
                numel=int(t.numel()),
                sum=float(t.sum()),
                first=float(t[0]),
                last=float(t[-1]),
                mapped=mapped_file(t.data_ptr()),
            )
            del t
        payload.data = data
        return payload

    return SimpleScheduler(fn)
