"""Async compute on the stage's trio loop, for an ``async def`` compute function that awaits trio only.

By default an ``async def`` compute function runs on an asyncio loop of the
scheduler thread, as in SGLang-Omni (it may await asyncio). That costs two
OS thread wake-ups per request (the inbox's notify one way, ``run_sync_soon``
back), each about what a ZMQ message costs on a small machine. A function
that awaits trio only needs no thread: with ``run_on_trio_loop=True`` a
:class:`SimpleScheduler` or :class:`ThreadedSimpleScheduler` is attached to
its stage's nursery (the scheduler's ``attach_loop``), and from then on each
``new_request`` is computed by one of ``concurrency`` runner tasks of that
nursery: no thread, no ``run_sync_soon``, the result put into the outbox on
the loop (which wakes the drain without a thread).

A scheduler driven by hand (``start()`` on a thread of one's own, as the
scheduler tests do) is never attached and keeps running async compute on
its thread's private asyncio loop.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import threading
from collections.abc import Callable
from typing import Any, Protocol

import trio

from omni_trio.scheduling.protocol import IncomingMessage


def is_async_callable(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine or an async generator: an ``async def`` function, a
    partial of one, or an object whose ``__call__`` is one (a plain function that returns an awaitable
    is not)."""
    call = type(fn).__call__ if callable(fn) and not inspect.isroutine(fn) else None
    checks = (inspect.iscoroutinefunction, inspect.isasyncgenfunction)
    return any(check(target) for check in checks for target in (fn, call))


def checked_for_trio_loop(compute_fn: object, *, batch_compute_fn: object = None, inline: bool = False) -> None:
    """Raise ValueError unless ``compute_fn`` can run on the stage's trio loop (``run_on_trio_loop=True``)."""
    if not is_async_callable(compute_fn):
        raise ValueError(
            f"run_on_trio_loop=True needs an async def compute_fn, got {compute_fn!r}: a plain function "
            "runs on the scheduler thread"
        )
    if batch_compute_fn is not None or inline:
        raise ValueError("run_on_trio_loop=True computes one request at a time: drop batch_compute_fn and inline")


class LoopCompute(Protocol):
    """A scheduler whose requests :class:`LoopComputes` computes on the stage's loop."""

    async def compute_on_loop(self, msg: IncomingMessage) -> None:
        """Compute ``msg``'s request and emit its outcome; must not raise ``Exception`` (user errors
        become ``error`` messages)."""


class LoopComputes:
    """Runner tasks on the stage's loop that compute queued requests, ``concurrency`` at a time.

    ``scheduler.compute_on_loop(msg)`` computes and emits one request.
    Requests start in arrival order; with one runner they also finish in it.
    :meth:`cancel` cancels a running compute (an abort);
    :meth:`stop` lets the running computes finish and starts no more;
    :meth:`wait_finished` (on the scheduler thread) returns once every
    runner has ended, so the stage's wait for its scheduler thread covers
    the computes on the loop too.
    """

    def __init__(self, scheduler: LoopCompute, concurrency: int) -> None:
        self._scheduler = scheduler
        self._concurrency = concurrency
        #: Requests waiting for a runner, oldest first (``max_pending`` counts them).
        self.waiting: collections.deque[IncomingMessage] = collections.deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._scopes: dict[str, trio.CancelScope] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop_thread: int | None = None
        self._live = 0
        self._stopping = False
        self._finished = threading.Event()

    @property
    def attached(self) -> bool:
        """Whether a stage's loop runs the computes (else the scheduler thread does)."""
        return self._token is not None

    def attach(self, nursery: trio.Nursery) -> None:
        """Start the runner tasks in ``nursery`` (the stage's, on its loop thread)."""
        self._token = trio.lowlevel.current_trio_token()
        self._loop_thread = threading.get_ident()
        self._live = self._concurrency
        for _ in range(self._concurrency):
            nursery.start_soon(self._runner)

    def submit(self, msg: IncomingMessage) -> None:
        """Queue ``msg`` for a runner (on the loop thread; never blocks)."""
        self.waiting.append(msg)
        self._lot.unpark()

    def cancel(self, request_id: str) -> None:
        """Cancel ``request_id``'s compute if it runs now (from any thread)."""
        self._on_loop(self._cancel_now, request_id)

    def stop(self) -> None:
        """Start no further compute; the running ones finish (from any thread, repeatable)."""
        if self.attached:
            self._on_loop(self._stop_now)
        else:
            self._stopping = True

    def wait_finished(self) -> None:
        """Block (the scheduler thread) until every runner ended; at once if never attached."""
        if self.attached:
            self._finished.wait()

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        if self._token is None:
            return
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        with contextlib.suppress(trio.RunFinishedError):  # the loop is gone, and its runners with it
            self._token.run_sync_soon(fn, *args)

    def _cancel_now(self, request_id: str) -> None:
        scope = self._scopes.get(request_id)
        if scope is not None:
            scope.cancel()

    def _stop_now(self) -> None:
        self._stopping = True
        self.waiting.clear()
        self._lot.unpark_all()

    async def _runner(self) -> None:
        try:
            while not self._stopping:
                if not self.waiting:
                    await self._lot.park()
                    continue
                msg = self.waiting.popleft()
                with trio.CancelScope() as scope:
                    self._scopes[msg.request_id] = scope
                    try:
                        await self._scheduler.compute_on_loop(msg)
                    finally:
                        del self._scopes[msg.request_id]
                if self.waiting:
                    # A backlog: let the stage's other tasks (its drain first) run between computes.
                    await trio.lowlevel.checkpoint()
        finally:
            self._live -= 1
            if not self._live:
                self._finished.set()
