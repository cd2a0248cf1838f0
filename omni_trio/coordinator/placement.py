"""The coordinator's view of where the stages run: the :class:`Placement` protocol."""

from __future__ import annotations

from typing import Protocol

import trio

from omni_trio.payload import StagePayload
from omni_trio.stage.stats import StageStats

__all__ = ["Placement"]


class Placement(Protocol):
    """Where the stages run, as the coordinator sees it: how it reaches them there.

    The runtime gives the coordinator one: :class:`~omni_trio.runtime.embedded.EmbeddedPlacement` (every
    stage in the caller's trio loop) or :class:`~omni_trio.runtime.worker_placement.WorkerPlacement`
    (stages in worker processes too).
    """

    async def submit(self, stage: str, payload: StagePayload) -> None:
        """Deliver a new request to ``stage`` (the entry stage)."""

    def abort(self, request_id: str) -> trio.Event:
        """Start telling every stage to drop ``request_id`` (at once: nothing waits in a task before
        the abort is on its way); the event fires once every stage did, or once the placement
        stops waiting for a process that does not answer (it goes on delivering the abort)."""

    async def stats(self, timeout: float | None = None) -> dict[str, StageStats]:
        """Every stage's counters; :class:`~omni_trio.StatsTimeout` when a process does not answer in ``timeout`` s."""

    def sent_bytes(self) -> dict[str, dict[str, int]]:
        """Tensor bytes the coordinator sent (submitted inputs): ``{entry stage: {transport: bytes}}``."""

    def health(self) -> dict[str, str]:
        """The state of each process that runs stages (see :class:`PipelineHealth`)."""

    def refused_frames(self) -> dict[str, int]:
        """Per process, the messages refused for want of the run's proof (none without sockets)."""

    def refused_connections(self) -> dict[str, int]:
        """Per process, the connections its inbox closed for its limits (none without sockets)."""

    def undeliverable(self) -> dict[str, int]:
        """Per process, the messages dropped because nobody listened at a peer's path (none without sockets)."""

    def superseded_messages(self) -> dict[str, int]:
        """Per process that joined over TCP, the messages of its given-up incarnations that were dropped."""
