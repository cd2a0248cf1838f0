"""Stage reports arriving at the caller's endpoint, handed to the coordinator.

Workers' stages report results (:class:`~omni_trio.control.wire.messages.Complete`), stream chunks
(:class:`~omni_trio.control.wire.messages.Stream`) and what they hold
(:class:`~omni_trio.control.wire.messages.HeldReport`, the abort safety net) to the main process;
:func:`route_stage_reports` registers the endpoint's handlers that read them (through the data plane
where they carry data) and call the coordinator's hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_trio.comm.dataref import DataRef
from omni_trio.config.replicas import logical_name
from omni_trio.control.endpoint import COORDINATOR, Endpoint, chunk_list
from omni_trio.control.wire import messages as m

if TYPE_CHECKING:
    from omni_trio.coordinator.coordinator import Coordinator


def route_stage_reports(coordinator: Coordinator, endpoint: Endpoint) -> None:
    """Route stage reports arriving at the main endpoint to the coordinator."""

    async def on_complete(message: m.Complete) -> None:
        # The sender's address (a replica's ``voc@r1``) routes the ACK; the coordinator hears its stage name.
        request_id, address = message.request_id, message.from_stage
        stage = logical_name(address)
        if not message.success or message.data_ref is None:
            error = message.error or "failed without an error text"
            coordinator.on_complete(request_id, stage, error=error, refused=message.refused)
            return

        async def deliver(result: Any) -> None:
            coordinator.on_complete(request_id, stage, result=result)

        await endpoint.receive_object(DataRef.from_wire(message.data_ref), request_id, address, COORDINATOR, deliver)

    async def on_stream(message: m.Stream) -> None:
        stage = logical_name(message.from_stage)

        async def deliver(chunks: Any) -> None:
            try:
                data = chunk_list(chunks, message.chunk_count)
            except ValueError as exc:
                error = f"stream chunks for the caller: {exc}"
                coordinator.on_complete(message.request_id, stage, error=error)
                return
            for offset, chunk in enumerate(data):
                chunk_id = message.chunk_id + offset
                coordinator.on_stream(message.request_id, stage, chunk, chunk_id, message.modality)

        await endpoint.receive_object(
            DataRef.from_wire(message.data_ref),
            message.request_id,
            message.from_stage,
            COORDINATOR,
            deliver,
            chunk_ids=range(message.chunk_id, message.chunk_id + message.chunk_count),
        )

    async def on_held(message: m.HeldReport) -> None:
        coordinator.retire_unknown(message.request_ids)

    endpoint.on(m.Complete, on_complete)
    endpoint.on(m.Stream, on_stream)
    endpoint.on(m.HeldReport, on_held)
    endpoint.on_submit_failure(lambda request_id, error: coordinator.on_complete(request_id, COORDINATOR, error=error))
