"""The stages one process runs, as its endpoint's parts see them, and where every stage runs.

:class:`HostedStages` is what the receiver delivers to, what fails a request on behalf of a stage
here (or of the coordinator, in the main process) and what the abort safety net asks for the
requests held; :class:`Placement` says which process a stage (or the coordinator) runs in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from omni_trio.comm.router import COORDINATOR
from omni_trio.control.hosted import HostedStage


class Placement:
    """Which process each stage address runs in (``placement``: address -> process; the rest run in ``main``)."""

    def __init__(self, placement: dict[str, str]) -> None:
        self._placement = placement

    def process_of(self, stage: str) -> str:
        """The process ``stage`` (or the coordinator) runs in."""
        return "main" if stage == COORDINATOR else self._placement.get(stage, "main")

    def stages_in(self, process: str) -> set[str]:
        """The stage addresses that run in ``process``."""
        return {address for address, where in self._placement.items() if where == process}


class HostedStages:
    """The stages of one process (``process``), by address (see the module docstring)."""

    def __init__(self, process: str) -> None:
        self._process = process
        self._stages: dict[str, HostedStage] = {}
        self._fail_submitted: Callable[[str, str], None] | None = None

    def host(self, stages: Mapping[str, HostedStage]) -> None:
        """These stages run here: what arrives for them is delivered to them."""
        self._stages.update(stages)

    def on_submit_failure(self, fail: Callable[[str, str], None]) -> None:
        """In the main process: ``fail(request_id, error)`` fails a request whose inputs were not delivered."""
        self._fail_submitted = fail

    def stage(self, name: str) -> HostedStage:
        """The stage ``name`` of this process (LookupError if it runs elsewhere)."""
        stage = self._stages.get(name)
        if stage is None:
            raise LookupError(f"stage {name!r} does not run in process {self._process!r}")
        return stage

    async def fail_request(self, sender: str, request_id: str, error: str) -> None:
        """Fail ``request_id`` on behalf of ``sender``, a stage (or the coordinator) of this process."""
        stage = self._stages.get(sender)
        if stage is not None:
            await stage.send_failure(request_id, error)
        elif sender == COORDINATOR and self._fail_submitted is not None:
            self._fail_submitted(request_id, error)

    def is_retired(self, sender: str, request_id: str) -> bool:
        """Whether ``sender`` (a stage here) already dropped ``request_id``."""
        stage = self._stages.get(sender)
        return stage is not None and request_id in stage.aborted

    def abort(self, request_ids: Collection[str]) -> None:
        """Every stage here drops each of ``request_ids``."""
        for stage in self._stages.values():
            stage.abort_requests(request_ids)

    def held(self) -> list[str]:
        """The requests the stages here hold, sorted."""
        return sorted({request_id for stage in self._stages.values() for request_id in stage.active})

    def any_active(self) -> bool:
        """Whether a stage here holds any request."""
        return any(stage.active for stage in self._stages.values())
