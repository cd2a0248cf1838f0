"""Computes that outlive their request: user code still running for a request nobody waits for.

An abort (or a deadline, or a failure elsewhere) drops a request at once, but the
scheduler's thread may be stuck in user code for it: nothing can interrupt a
Python thread. Such a compute is not harmless: a serial scheduler serves nothing
else meanwhile, so later requests queue behind it. The stage therefore reports
it: a compute still running :data:`STUCK_AFTER_S` after its request was dropped
is *stuck*; ``stats()`` lists it (the stage is then neither idle nor healthy) and
the stage logs ``compute_stuck_after_abort`` once, naming the stage, the request
and how long it has run. The schedulers say what runs through an optional
``running_computes()`` method (every built-in :class:`~omni_trio.SimpleScheduler`
has it); a scheduler without it reports nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Container
from typing import Protocol, runtime_checkable

import trio

from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: How long a compute may outlive its dropped request before the stage reports it as stuck.
STUCK_AFTER_S = 1.0


@runtime_checkable
class ReportsComputes(Protocol):
    """A scheduler that says which computes run (every built-in scheduler)."""

    def running_computes(self) -> dict[str, float]:
        """``request_id -> start time`` (``time.monotonic()``) of every compute running now."""


class AbandonedComputes:
    """Tracks the computes of one stage's dropped requests (see the module docstring).

    ``scheduler`` is the stage's scheduler when it reports its computes, else None (nothing is tracked).
    """

    def __init__(self, stage: str, scheduler: ReportsComputes | None) -> None:
        self._stage = stage
        self._scheduler = scheduler
        #: request id -> when it was dropped (``trio.current_time()``), only while its compute runs.
        self._dropped: dict[str, float] = {}

    def running(self) -> dict[str, float]:
        """``request_id -> start time`` of every compute running now (empty without the hook)."""
        return {} if self._scheduler is None else self._scheduler.running_computes()

    def dropped(self, request_id: str, nursery: trio.Nursery | None) -> None:
        """``request_id`` was dropped here: if its compute still runs, watch it (one timer, no poll)."""
        if self._scheduler is None or request_id not in self._scheduler.running_computes():
            return
        self._dropped[request_id] = trio.current_time()
        if nursery is not None:
            nursery.start_soon(self._warn_if_still_running, request_id)

    async def _warn_if_still_running(self, request_id: str) -> None:
        await trio.sleep(STUCK_AFTER_S)
        started = self.running().get(request_id)
        if started is not None:
            log.warning(
                "compute_stuck_after_abort",
                stage=self._stage,
                request_id=request_id,
                running_s=round(time.monotonic() - started, 3),
                note="nobody waits for this compute; later requests may queue behind it",
            )

    def stuck(self, dropped_ids: Container[str]) -> dict[str, float]:
        """``request_id -> seconds since it was dropped`` for computes running past :data:`STUCK_AFTER_S`
        (``dropped_ids``: the stage's retired requests, for a compute that started after its drop)."""
        running = self.running()
        now = trio.current_time()
        for request_id in list(self._dropped):
            if request_id not in running:
                del self._dropped[request_id]
        for request_id in running:
            if request_id not in self._dropped and request_id in dropped_ids:
                self._dropped[request_id] = now
        return {
            request_id: round(now - since, 3)
            for request_id, since in self._dropped.items()
            if now - since >= STUCK_AFTER_S
        }

    def describe_running(self) -> dict[str, float]:
        """``request_id -> seconds it has run`` of every compute running now (for the shutdown log)."""
        now = time.monotonic()
        return {request_id: round(now - since, 3) for request_id, since in self.running().items()}
