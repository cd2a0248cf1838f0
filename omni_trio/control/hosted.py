"""HostedStage: what the endpoint and its receiver call on the stages of their process.

The control plane sits below the stages (docs/design.md, "Layers"): it names the members it
calls here instead of importing the stage, and :class:`omni_trio.stage.stage.Stage` has them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container
from typing import Protocol

from omni_trio.payload import StagePayload, StreamItem


class HostedStage(Protocol):
    """A stage this process runs, as its endpoint sees it."""

    @property
    def address(self) -> str:
        """Where its messages go: its name, or ``name@r<replica>`` for a replica."""

    @property
    def reports_takes(self) -> bool:
        """Whether it tells when a delivered chunk was taken (what returns a sender's credit)."""

    @property
    def active(self) -> Collection[str]:
        """The requests it holds."""

    @property
    def aborted(self) -> Container[str]:
        """The requests it retired (aborted or failed): nothing more is delivered for them."""

    async def on_submit(self, payload: StagePayload, bindings: dict[str, int] | None = None) -> None:
        """A new request from the coordinator (an entry stage)."""

    async def deliver_payload(
        self, request_id: str, from_stage: str, payload: StagePayload, bindings: dict[str, int] | None = None
    ) -> None:
        """An upstream stage's payload arrived."""

    async def deliver_stream_chunks(
        self,
        request_id: str,
        from_stage: str,
        items: list[StreamItem],
        on_taken: Callable[[], object] | None = None,
        bindings: dict[str, int] | None = None,
    ) -> bool:
        """Upstream chunks arrived, in order; True when ``on_taken`` will run once the last is taken."""

    async def deliver_stream_signal(
        self, request_id: str, from_stage: str, error: str | None = None, bindings: dict[str, int] | None = None
    ) -> None:
        """An upstream stream ended (or failed with ``error``)."""

    async def send_failure(self, request_id: str, error: str, *, refused: bool = False) -> None:
        """Fail ``request_id`` here: report it to the coordinator and drop its state."""

    def abort_requests(self, request_ids: Collection[str]) -> None:
        """Drop everything about each of ``request_ids`` here (an abort)."""
