"""How a stage reaches its peers, whatever process they live in.

A stage never knows whether a target stage or the coordinator is in its own
process: it talks to a :class:`StageLink` per target and one
:class:`CoordinatorLink`. This module defines those seams and their
same-process implementations, and :class:`ReplicaLink`, which picks a
replicated target's replica by the request's binding; the multi-process runtime
provides remote ones with the same methods.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from omni_trio.comm.router import COORDINATOR, TransportLog
from omni_trio.comm.transfer import tensor_bytes
from omni_trio.control.bindings import BindingTable
from omni_trio.payload import StagePayload, StreamItem


class StageLink(Protocol):
    """One stage's outgoing edge to another stage."""

    #: The target stage's name.
    target: str
    #: True when the target lives in the sender's process.
    local: bool

    async def payload(self, request_id: str, from_stage: str, payload: StagePayload, *, share: bool) -> None:
        """Hand ``payload`` to the target; ``share=False`` means the target gets its own copy."""

    async def stream_chunks(self, request_id: str, from_stage: str, items: list[StreamItem]) -> None:
        """Hand stream chunks of one request, in order, to the target."""

    async def stream_signal(self, request_id: str, from_stage: str, error: str | None = None) -> None:
        """Tell the target that the sender's stream ended (or failed with ``error``)."""


class CoordinatorLink(Protocol):
    """A stage's edge to the coordinator."""

    async def complete(
        self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None, refused: bool = False
    ) -> None:
        """Report a terminal result, or (``error`` set) a failure of the request (``refused``: for lack of
        room, a scheduler's ``QueueFullError``)."""

    async def stream(
        self, request_id: str, from_stage: str, chunks: list[Any], first_chunk_id: int, modality: str | None
    ) -> None:
        """Deliver consecutive stream chunks (ids ``first_chunk_id, ...``) of a terminal stage to the caller."""


class CoordinatorReports(Protocol):
    """What a stage's same-process edge reports to: the coordinator's side of :class:`CoordinatorLink`."""

    def on_complete(
        self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None, refused: bool = False
    ) -> None:
        """A stage reported a terminal result, or a failure (``error`` set; ``refused``: for lack of room)."""

    def on_stream(self, request_id: str, from_stage: str, chunk: Any, chunk_id: int, modality: str | None) -> None:
        """A terminal stage streamed a chunk."""


class DeliveryTarget(Protocol):
    """What a same-process edge hands things to: the receiving side of a :class:`~omni_trio.stage.stage.Stage`."""

    #: The stage's name.
    name: str

    async def deliver_payload(self, request_id: str, from_stage: str, payload: StagePayload) -> None:
        """An upstream stage's payload arrived."""

    async def deliver_stream_chunks(self, request_id: str, from_stage: str, items: list[StreamItem]) -> object:
        """Upstream stream chunks arrived, in order."""

    async def deliver_stream_signal(self, request_id: str, from_stage: str, error: str | None = None) -> None:
        """An upstream stream ended (or failed with ``error``)."""


class LocalStageLink:
    """An edge to a stage in the same process: objects are handed over directly."""

    local = True

    def __init__(self, target: DeliveryTarget, transports: TransportLog) -> None:
        self.target = target.name
        self._stage = target
        self._transports = transports

    async def payload(self, request_id: str, from_stage: str, payload: StagePayload, *, share: bool) -> None:
        """Deliver the payload itself when shared, else a deep copy (tensors cloned)."""
        self._transports.note("payload", self.target, "local_object" if share else "local_copy", tensor_bytes(payload))
        delivered = payload if share else copy.deepcopy(payload)
        await self._stage.deliver_payload(request_id, from_stage, delivered)

    async def stream_chunks(self, request_id: str, from_stage: str, items: list[StreamItem]) -> None:
        """Deliver the chunks by reference (receivers treat them as read-only)."""
        # Counted as the remote link sends them: each chunk with its metadata.
        carried = tensor_bytes([(item.data, item.metadata) for item in items])
        self._transports.note("stream", self.target, "local_object", carried)
        await self._stage.deliver_stream_chunks(request_id, from_stage, items)

    async def stream_signal(self, request_id: str, from_stage: str, error: str | None = None) -> None:
        """Deliver the end-of-stream (or stream error) signal."""
        await self._stage.deliver_stream_signal(request_id, from_stage, error)


class ReplicaLink:
    """An edge to a replicated stage: each request goes to the replica it is bound to."""

    local = False

    def __init__(self, target: str, replicas: Sequence[StageLink], bindings: BindingTable) -> None:
        self.target = target
        self._replicas = replicas
        self._bindings = bindings

    def _link(self, request_id: str) -> StageLink:
        return self._replicas[self._bindings.replica(request_id, self.target)]

    async def payload(self, request_id: str, from_stage: str, payload: StagePayload, *, share: bool) -> None:
        """Send the payload to the bound replica."""
        await self._link(request_id).payload(request_id, from_stage, payload, share=share)

    async def stream_chunks(self, request_id: str, from_stage: str, items: list[StreamItem]) -> None:
        """Send the chunks to the bound replica."""
        await self._link(request_id).stream_chunks(request_id, from_stage, items)

    async def stream_signal(self, request_id: str, from_stage: str, error: str | None = None) -> None:
        """Send the end-of-stream (or error) signal to the bound replica."""
        await self._link(request_id).stream_signal(request_id, from_stage, error)


class LocalCoordinatorLink:
    """The coordinator lives in this process: report to it directly.

    ``transports(stage)`` is the sending stage's :class:`TransportLog`, which
    counts what each stage hands the caller (as ``local_object`` to ``"coordinator"``).
    """

    def __init__(self, coordinator: CoordinatorReports, transports: Callable[[str], TransportLog]) -> None:
        self._coordinator = coordinator
        self._transports = transports

    async def complete(
        self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None, refused: bool = False
    ) -> None:
        """Report completion or failure."""
        if error is None:
            self._transports(from_stage).note("result", COORDINATOR, "local_object", tensor_bytes(result))
        self._coordinator.on_complete(request_id, from_stage, result=result, error=error, refused=refused)

    async def stream(
        self, request_id: str, from_stage: str, chunks: list[Any], first_chunk_id: int, modality: str | None
    ) -> None:
        """Deliver the chunks to the caller's stream."""
        self._transports(from_stage).note("stream", COORDINATOR, "local_object", tensor_bytes(chunks))
        for offset, chunk in enumerate(chunks):
            self._coordinator.on_stream(request_id, from_stage, chunk, first_chunk_id + offset, modality)
