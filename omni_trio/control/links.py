"""The edges of a stage to peers in other processes: everything goes through the process's Endpoint.

:class:`RemoteStageLink` and :class:`RemoteCoordinatorLink` implement the stage's ``StageLink`` and
``CoordinatorLink`` protocols (omni_trio/stage/links.py has the same-process ones); the stage never
knows which kind it holds. A replica's links send under its address (``voc@r1``), so that ACKs and
credits come back to it, and every DataReady carries the request's replica binding, if it has one.
"""

from __future__ import annotations

from typing import Any

from omni_trio.comm.dataref import DataRefKind
from omni_trio.config.replicas import replica_name
from omni_trio.control.bindings import BindingTable
from omni_trio.control.endpoint import COORDINATOR, Endpoint
from omni_trio.control.wire import messages as m
from omni_trio.payload import StagePayload, StreamItem


class RemoteStageLink:
    """An edge to a stage in another process: data goes through :class:`Endpoint`."""

    local = False

    def __init__(self, endpoint: Endpoint, sender: str, target: str, bindings: BindingTable | None = None) -> None:
        self.target = target
        self._endpoint = endpoint
        self._sender = sender
        self._process = endpoint.placement[target]
        self._bindings = bindings

    def _binding(self, request_id: str) -> dict[str, int] | None:
        return None if self._bindings is None else self._bindings.of(request_id)

    async def payload(self, request_id: str, from_stage: str, payload: StagePayload, *, share: bool) -> None:
        """Send the payload (inline or through shared memory)."""
        sender, bindings = self._sender, self._binding(request_id)
        await self._endpoint.send_object(
            payload,
            request_id=request_id,
            sender=sender,
            receiver=self.target,
            kind=DataRefKind.stage_payload,
            direction="payload",
            make=lambda ref: m.DataReady(
                request_id=request_id, from_stage=sender, to_stage=self.target, data_ref=ref, replica_bindings=bindings
            ),
        )

    async def stream_chunks(self, request_id: str, from_stage: str, items: list[StreamItem]) -> None:
        """Send consecutive chunks (each with its metadata) in as few messages as possible."""
        sender, bindings = self._sender, self._binding(request_id)
        await self._endpoint.send_chunks(
            [(item.data, item.metadata) for item in items],
            items[0].chunk_id,
            request_id=request_id,
            sender=sender,
            receiver=self.target,
            make=lambda ref, first, count: m.DataReady(
                request_id=request_id,
                from_stage=sender,
                to_stage=self.target,
                data_ref=ref,
                chunk_id=first,
                chunk_count=count,
                replica_bindings=bindings,
            ),
        )

    async def stream_signal(self, request_id: str, from_stage: str, error: str | None = None) -> None:
        """Send the end-of-stream (or stream error) signal."""
        message = m.DataReady(
            request_id=request_id,
            from_stage=self._sender,
            to_stage=self.target,
            is_done=error is None,
            error=error,
            replica_bindings=self._binding(request_id),
        )
        await self._endpoint.send(self._process, message)


class RemoteCoordinatorLink:
    """A worker stage's edge to the coordinator in the main process (a replica's reports carry its address)."""

    def __init__(self, endpoint: Endpoint, replica: int | None = None) -> None:
        self._endpoint = endpoint
        self._replica = replica

    def _address(self, from_stage: str) -> str:
        return from_stage if self._replica is None else replica_name(from_stage, self._replica)

    async def complete(
        self, request_id: str, from_stage: str, *, result: Any = None, error: str | None = None, refused: bool = False
    ) -> None:
        """Send the terminal result (through the data plane: it may hold tensors) or a failure."""
        from_stage = self._address(from_stage)
        if error is not None:
            failure = m.Complete(request_id=request_id, from_stage=from_stage, success=False, error=error,
                                 refused=refused)
            await self._endpoint.send("main", failure)
            return
        await self._endpoint.send_object(
            result,
            request_id=request_id,
            sender=from_stage,
            receiver=COORDINATOR,
            kind=DataRefKind.stage_payload,
            direction="result",
            make=lambda ref: m.Complete(request_id=request_id, from_stage=from_stage, success=True, data_ref=ref),
        )

    async def stream(
        self, request_id: str, from_stage: str, chunks: list[Any], first_chunk_id: int, modality: str | None
    ) -> None:
        """Send consecutive chunks for the caller's stream (through the data plane, few messages)."""
        from_stage = self._address(from_stage)
        await self._endpoint.send_chunks(
            chunks,
            first_chunk_id,
            request_id=request_id,
            sender=from_stage,
            receiver=COORDINATOR,
            make=lambda ref, first, count: m.Stream(
                request_id=request_id,
                from_stage=from_stage,
                chunk_id=first,
                chunk_count=count,
                modality=modality,
                data_ref=ref,
            ),
        )
