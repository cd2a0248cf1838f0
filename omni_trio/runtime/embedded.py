"""The embedded placement: every stage in the caller's process, on the caller's trio loop.

No child process and no socket: the coordinator hands requests to the stages directly
(:class:`EmbeddedPlacement`) and they report back to it directly
(:class:`~omni_trio.stage.links.LocalCoordinatorLink`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from omni_trio.comm.router import COORDINATOR, TransportLog, TransportLogs
from omni_trio.comm.transfer import tensor_bytes
from omni_trio.config import MAIN_PROCESS, PipelineConfig
from omni_trio.coordinator.coordinator import Coordinator
from omni_trio.payload import StagePayload
from omni_trio.runtime.assembly import build_stages, connect_stages
from omni_trio.stage.links import LocalCoordinatorLink
from omni_trio.stage.stage import Stage
from omni_trio.stage.stats import StageStats
from omni_trio.tracing.trace import Tracer


class EmbeddedPlacement:
    """Every stage runs in the caller's trio loop: the coordinator calls them directly; ``transports``
    counts what it submits."""

    def __init__(self, stages: dict[str, Stage], transports: TransportLog) -> None:
        self._stages = stages
        self._transports = transports

    async def submit(self, stage: str, payload: StagePayload) -> None:
        """Hand a new request to the entry stage."""
        self._transports.note("submit", stage, "local_object", tensor_bytes(payload))
        await self._stages[stage].on_submit(payload)

    def abort(self, request_id: str) -> trio.Event:
        """Every stage drops ``request_id``, at once: the event returned is set already."""
        for stage in self._stages.values():
            stage.on_abort(request_id)
        done = trio.Event()
        done.set()
        return done

    async def stats(self, timeout: float | None = None) -> dict[str, StageStats]:
        """Every stage's counters (read at once: ``timeout`` has nothing to bound)."""
        return {name: stage.stats() for name, stage in self._stages.items()}

    def sent_bytes(self) -> dict[str, dict[str, int]]:
        """Tensor bytes submitted, by entry stage and transport."""
        return self._transports.sent_bytes()

    def health(self) -> dict[str, str]:
        """The caller's process is alive while it can answer."""
        return {MAIN_PROCESS: "ready"}

    def refused_frames(self) -> dict[str, int]:
        """No sockets, nothing to refuse."""
        return {}

    def refused_connections(self) -> dict[str, int]:
        """No sockets, nobody connects."""
        return {}

    def undeliverable(self) -> dict[str, int]:
        """No sockets, nothing to drop."""
        return {}

    def superseded_messages(self) -> dict[str, int]:
        """No worker joins, none is given up."""
        return {}


@asynccontextmanager
async def run_embedded(config: PipelineConfig, tracer: Tracer) -> AsyncIterator[Coordinator]:
    """Build, run and yield the coordinator of ``config``'s stages, all in the caller's trio loop; stop them on exit."""
    async with trio.open_nursery() as nursery:
        stages: dict[str, Stage] = {}
        logs = TransportLogs(tracer)
        coordinator = Coordinator(config, EmbeddedPlacement(stages, logs.of(COORDINATOR)), tracer, nursery)
        link = LocalCoordinatorLink(coordinator, logs.of)
        stages.update(build_stages(config, config.stages, process=MAIN_PROCESS, tracer=tracer, coordinator=link))
        connect_stages(config, stages, None, tracer, transport_logs=logs)
        try:
            for stage in stages.values():
                await nursery.start(stage.run)
            yield coordinator
        finally:
            await coordinator.close()
            for stage in stages.values():
                stage.stop()
