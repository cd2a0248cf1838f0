"""What a worker's death does to the live requests of a multi-process pipeline.

Each live request ends with :class:`~omni_trio.StageProcessDied` naming the dead
process, attributed by asking the other processes what they hold (one round trip,
bounded by :data:`~omni_trio.runtime.worker_placement.HOLDERS_TIMEOUT_S`): a request no
live process holds was in the dead one, or on its way there ("lost",
``held_by`` None); a request another process holds is aborted there at once
(``held_by`` names it), since it may still need the dead process. Every failed
request is aborted everywhere, so no thread keeps computing it and the
pipeline's exit does not wait for one. With a restart policy the same requests
fail (the restarted process starts empty; new submits wait for it); without one
the pipeline then ends. Of a replicated group whose other replicas live on, only
the requests bound to the dead replica fail.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from omni_trio.errors import StageProcessDied

if TYPE_CHECKING:
    from omni_trio.coordinator.coordinator import Coordinator
    from omni_trio.coordinator.replicas import ReplicaDispatcher
    from omni_trio.runtime.worker_placement import WorkerPlacement
    from omni_trio.runtime.workers.supervisor import Worker


class WorkerDeaths:
    """The supervisor's ``on_death``/``on_lost`` for one pipeline (see the module docstring)."""

    def __init__(
        self,
        coordinator: Coordinator,
        placement: WorkerPlacement,
        replicas: ReplicaDispatcher,
        on_fatal: Callable[[StageProcessDied], None],
    ) -> None:
        self._coordinator = coordinator
        self._placement = placement
        self._replicas = replicas
        self._on_fatal = on_fatal

    async def _errors(self, worker: Worker) -> Callable[[str], StageProcessDied]:
        """The error of each request, once the live processes said what they hold."""
        # Its replies will never come: nothing waits for them (pending aborts included) from now on.
        self._placement.forget(worker.name)
        holders = await self._placement.holders()

        def error_for(request_id: str) -> StageProcessDied:
            return StageProcessDied(
                request_id, worker.name, worker.pid, worker.returncode, held_by=holders.get(request_id)
            )

        return error_for

    async def _fail(self, worker: Worker, only: set[str] | None) -> list[str]:
        """Fail the requests ``only`` (taken at the death, before anything is awaited: one admitted
        meanwhile waits for the restart), or every live one; return their ids."""
        error_for = await self._errors(worker)
        failed: list[str] = []

        def counted(request_id: str) -> StageProcessDied:
            failed.append(request_id)
            return error_for(request_id)

        self._coordinator.fail_all(counted, abort_everywhere=True, only=only)
        return sorted(failed)

    async def on_death(self, worker: Worker) -> None:
        """A worker died for good: fail its requests; the pipeline ends unless a replica group lives on."""
        if self._replicas.survivable(worker.name):
            self._replicas.mark(worker.name, "dead")
            await self._fail(worker, set(self._replicas.bound_to(worker.name)))
            return
        await self._fail(worker, None)  # the pipeline ends: every request fails with the death
        self._on_fatal(StageProcessDied(None, worker.name, worker.pid, worker.returncode))

    async def on_lost(self, worker: Worker) -> list[str]:
        """A worker died and will be restarted: fail what it may have held; return those request ids
        (the restarted process drops messages for them)."""
        if self._replicas.is_replica(worker.name):
            self._replicas.mark(worker.name, "restarting")
            return await self._fail(worker, set(self._replicas.bound_to(worker.name)))
        return await self._fail(worker, self._coordinator.live_request_ids())
