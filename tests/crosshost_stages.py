"""Stages of the cross-host tests: tensors big enough for shared memory (or TCP) on every edge."""

from __future__ import annotations

from typing import Any

from omni_trio import SimpleScheduler, StagePayload
from tests.stages import Releases


def create_make(numel: int = 1 << 20) -> SimpleScheduler:
    """``{"t": arange(numel)}`` (float32; 4 MiB by default)."""
    import torch

    def fn(payload: StagePayload) -> StagePayload:
        n = int(payload.request.params.get("numel", numel))
        payload.data = {"t": torch.arange(n, dtype=torch.float32)}
        return payload

    return SimpleScheduler(fn)


def create_scale(factor: float, ray_node: bool = False, blocks: bool = True, crash: bool = False) -> SimpleScheduler:
    """``t * factor``, and the pid of the process that did it (and, with ``ray_node``, its Ray node's id);
    a request with the ``block`` param is held forever (unless ``blocks`` is False); with ``crash``, one
    with the ``crash`` param kills the process."""
    import os
    import threading

    node = None
    if ray_node:
        import ray

        node = ray.get_runtime_context().get_node_id()

    def fn(payload: StagePayload) -> StagePayload:
        if crash and payload.request.params.get("crash"):
            os._exit(1)
        if blocks and payload.request.params.get("block"):  # hold the request until the process dies
            threading.Event().wait()
        payload.data = {"t": payload.data["t"] * factor, "pid": os.getpid(), "node": node}
        return payload

    return SimpleScheduler(fn)


def merge(inputs: dict[str, StagePayload]) -> StagePayload:
    """The sources' tensors side by side, with the pid of each."""
    first = next(iter(inputs.values()))
    first.data = {name: payload.data for name, payload in sorted(inputs.items())}
    return first


def create_join() -> SimpleScheduler:
    """Each source's tensor sum and length (a result that compares exactly across runs)."""

    def fn(payload: StagePayload) -> StagePayload:
        data: dict[str, Any] = payload.data
        payload.data = {
            name: {
                "sum": float(part["t"].double().sum()), "numel": int(part["t"].numel()), "pid": part["pid"],
                "node": part["node"],
            }
            for name, part in data.items()
        }
        return payload

    return SimpleScheduler(fn)


def create_total() -> SimpleScheduler:
    """The tensor's sum and length, and the pid of the stage before (a result that compares exactly)."""

    def fn(payload: StagePayload) -> StagePayload:
        data: dict[str, Any] = payload.data
        payload.data = {"sum": float(data["t"].double().sum()), "numel": int(data["t"].numel()), "pid": data["pid"]}
        return payload

    return SimpleScheduler(fn)


def create_block() -> SimpleScheduler:
    """Says ``BLOCKING`` on stderr, then never returns (until its process dies): a request held by a
    remote worker."""
    import sys
    import time

    def fn(payload: StagePayload) -> StagePayload:
        print("BLOCKING", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)

    return SimpleScheduler(fn)


def create_hold_slot() -> SimpleScheduler:
    """``t * 2`` and the pid; a request with the ``block`` param takes a 4 MiB slot of the stage's
    shared-memory pool (``ot.empty``), says ``BLOCKING <pid>`` on stderr and is held forever (until its
    process exits): a remote worker holding a request and a segment."""
    import os
    import sys
    import time

    import torch

    import omni_trio as ot

    def fn(payload: StagePayload) -> StagePayload:
        if payload.request.params.get("block"):
            slot = ot.empty(1 << 20, dtype=torch.float32)
            print("BLOCKING", os.getpid(), file=sys.stderr, flush=True)
            while slot is not None:
                time.sleep(3600)
        payload.data = {"t": payload.data["t"] * 2.0, "pid": os.getpid(), "node": None}
        return payload

    return SimpleScheduler(fn)


def create_where(replica: int, ray_node: bool = False) -> SimpleScheduler:
    """Which replica served a request: ``{"replica", "pid", "node", "actor"}`` (``node`` and ``actor``: its
    Ray node's id and its actor's name, with ``ray_node``); a request with the ``block`` param is held
    until it is aborted (or its process dies), after ``HELD <replica> <pid>`` on stderr."""
    import os
    import sys

    node = actor = None
    if ray_node:
        import ray

        context = ray.get_runtime_context()
        node, actor = context.get_node_id(), context.get_actor_name()
    releases = Releases()

    def fn(payload: StagePayload) -> StagePayload:
        if payload.request.params.get("block"):
            print("HELD", replica, os.getpid(), file=sys.stderr, flush=True)
            releases.of(payload.request_id).wait()
        releases.forget(payload.request_id)
        payload.data = {"replica": replica, "pid": os.getpid(), "node": node, "actor": actor}
        return payload

    return SimpleScheduler(fn, abort_callback=lambda request_id: releases.of(request_id).set(), max_concurrency=4)
