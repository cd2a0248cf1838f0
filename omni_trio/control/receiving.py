"""Receiving side of the data plane: read the object a message points to, ACK it, deliver it in order.

:class:`Receiver` turns Submit and DataReady messages into calls on the stages of its process
(``on_submit``, ``deliver_payload``, ``deliver_stream_chunks``, ``deliver_stream_signal``: the same
methods same-process links call), and reads the objects of the coordinator's Complete and Stream
messages for it (:meth:`Receiver.receive_object`). Reads overlap, deliveries keep arrival order per
(request, sender, receiver) flow (:mod:`omni_trio.control.ordering`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from omni_trio.comm.bulk import BulkFetcher
from omni_trio.comm.dataref import DataRef
from omni_trio.comm.router import COORDINATOR
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.comm.transfer import decode_object, tensor_bytes
from omni_trio.config.replicas import logical_name
from omni_trio.control.hosted import HostedStage
from omni_trio.control.hosting import HostedStages, Placement
from omni_trio.control.ordering import DeliveryOrder, Flow
from omni_trio.control.peers import Peers
from omni_trio.control.releases import CreditHold, ReleaseSender
from omni_trio.control.tasks import EndpointTasks
from omni_trio.control.wire import messages as m
from omni_trio.errors import describe_error
from omni_trio.payload import StagePayload, StreamItem
from omni_trio.tracing.trace import Tracer


def chunk_list(value: object, count: int) -> list[Any]:
    """The data of a chunk message: a list of ``count`` items (else ValueError)."""
    if type(value) is not list or len(value) != count:
        raise ValueError(f"expected a list of {count} chunk(s), got {type(value).__name__}")
    return value


def _checked_payload(payload: Any, request_id: str) -> StagePayload:
    if not isinstance(payload, StagePayload) or payload.request_id != request_id:
        raise ValueError(f"expected the StagePayload of {request_id!r}, got {type(payload).__name__}")
    return payload


class _ReadFailed(Exception):
    """Reading an object failed; the request was failed and the sender ACKed."""


async def _nothing() -> None:
    return None


class Receiver:
    """Reads, ACKs and delivers the objects sent to one process (see the module docstring).

    Built with: the ``stages`` of this process, the run's ``placement``, the process's ``peers``
    (what sends the ACKs), the endpoint's ``tasks``, the run's segment prefix, the mapping cache of
    peers' slots, the release sender, the tracer and the ``bulk`` fetcher of ``tcp`` transfers.
    """

    def __init__(
        self,
        *,
        stages: HostedStages,
        placement: Placement,
        peers: Peers,
        tasks: EndpointTasks,
        run_prefix: str,
        segments: SegmentCache,
        releases: ReleaseSender,
        tracer: Tracer,
        bulk: BulkFetcher,
    ) -> None:
        self._bulk = bulk
        self._stages = stages
        self._placement = placement
        self._peers = peers
        self._tasks = tasks
        self._run_prefix = run_prefix
        self._segments = segments
        self._releases = releases
        self._tracer = tracer
        self._order = DeliveryOrder()

    async def on_submit(self, message: m.Submit) -> None:
        """The coordinator's input for an entry stage here."""
        stage = self._stages.stage(message.to_stage)
        ref = DataRef.from_wire(message.data_ref)
        rid = message.request_id

        async def deliver(payload: Any) -> None:
            await stage.on_submit(_checked_payload(payload, rid), message.replica_bindings)

        await self.receive_object(ref, rid, COORDINATOR, message.to_stage, deliver)

    async def on_data_ready(self, message: m.DataReady) -> None:
        """A payload, stream chunks or a stream signal for a stage here."""
        stage = self._stages.stage(message.to_stage)
        # Addresses (``voc@r1``) route ACKs and credits; the stage sees the sender's stage name.
        rid, sender, receiver = message.request_id, message.from_stage, stage.address
        source, bindings = logical_name(sender), message.replica_bindings
        if message.is_signal:
            flow = (rid, sender, receiver)

            async def signal(_: Any) -> None:
                await stage.deliver_stream_signal(rid, source, message.error, bindings)

            await self._in_order(flow, _nothing, signal, needs_task=False)
            return
        ref = DataRef.from_wire(message.data_ref)
        if message.chunk_id is None:

            async def payload(value: Any) -> None:
                await stage.deliver_payload(rid, source, _checked_payload(value, rid), bindings)

            await self.receive_object(ref, rid, sender, receiver, payload)
            return
        first, count = message.chunk_id, message.chunk_count
        # A shared-memory chunk holds the sender's credit until the scheduler takes it (docs/design.md).
        credit = self._credit_hold(ref, rid, sender, stage)

        async def chunks(value: Any) -> None:
            adopted = False
            try:
                try:
                    pairs = chunk_list(value, count)
                    items = [
                        StreamItem(first + i, data, source, metadata) for i, (data, metadata) in enumerate(pairs)
                    ]
                except (TypeError, ValueError) as exc:
                    await stage.send_failure(rid, f"stream chunks from {sender!r}: {exc}")
                    return
                on_taken = None if credit is None else credit.give_back
                adopted = await stage.deliver_stream_chunks(rid, source, items, on_taken, bindings)
            finally:
                if credit is not None and not adopted:
                    credit.give_back()  # dropped, or not queued: nothing will take it

        await self.receive_object(
            ref, rid, sender, receiver, chunks, chunk_ids=range(first, first + count), credit=credit
        )

    async def receive_object(
        self,
        ref: DataRef,
        request_id: str,
        sender: str,
        receiver: str,
        deliver: Callable[[Any], Awaitable[None]],
        *,
        chunk_ids: range | None = None,
        credit: CreditHold | None = None,
    ) -> None:
        """Read the object ``ref`` points to (ACKing shared memory) and deliver it in arrival order.

        With ``credit``, a successful ACK says the receiver holds the sender's
        credit, and ``deliver`` must see to it that ``credit`` is given back.
        """
        flow = (request_id, sender, receiver)
        sender_process = self._placement.process_of(sender)

        async def read() -> Any:
            start = time.monotonic() if self._tracer.enabled else 0.0
            try:
                value = await decode_object(
                    ref,
                    shm_prefix=self._run_prefix,
                    segments=self._segments,
                    on_release=self._releases.slot_releaser(ref, sender_process, sender, receiver),
                    bulk=self._bulk,
                )
            except Exception as exc:
                if credit is not None:
                    credit.cancel()
                if ref.buffer is not None:
                    await self._ack(ref, request_id, sender, receiver, describe_error(exc))
                await self._stages.fail_request(
                    receiver, request_id, f"reading data from {sender!r} failed: {describe_error(exc)}"
                )
                raise _ReadFailed from exc
            if ref.buffer is not None:
                await self._ack(ref, request_id, sender, receiver, None, credit_held=credit is not None)
            if self._tracer.enabled and chunk_ids is not None:
                sizes = [tensor_bytes(chunk) for chunk in value] if type(value) is list else []
                self._tracer.event(
                    "comm_stream_read",
                    request_id=request_id,
                    from_stage=sender,
                    to_stage=receiver,
                    chunk_id=chunk_ids.start,
                    chunk_count=len(chunk_ids),
                    object_id=ref.object_id,
                    transport=ref.transport.value,
                    bytes=sum(sizes),
                    chunk_bytes=sizes,
                    wire_bytes=ref.wire_bytes,
                    elapsed_ms=round((time.monotonic() - start) * 1000, 6),
                )
            return value

        await self._in_order(flow, read, deliver, needs_task=ref.buffer is not None)

    async def _in_order(
        self,
        flow: Flow,
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
        *,
        needs_task: bool,
    ) -> None:
        """Deliver in arrival order: now if nothing is ahead and the read is instant, else in a task."""
        if not needs_task and self._order.idle(flow):
            with contextlib.suppress(_ReadFailed):
                await deliver(await read())
            return
        self._tasks.spawn(self._run_in_order, flow, self._order.claim(flow), read, deliver)

    async def _run_in_order(
        self,
        flow: Flow,
        place: Any,
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
    ) -> None:
        with contextlib.suppress(_ReadFailed):
            await self._order.run(flow, place, read, deliver)

    async def _ack(
        self, ref: DataRef, request_id: str, sender: str, receiver: str, error: str | None, *, credit_held: bool = False
    ) -> None:
        ack = m.DataAck(
            request_id=request_id,
            from_stage=receiver,
            to_stage=sender,
            object_id=ref.object_id,
            success=error is None,
            error=error,
            credit_held=credit_held,
        )
        await self._peers.send(self._placement.process_of(sender), ack)

    def _credit_hold(self, ref: DataRef, request_id: str, sender: str, stage: HostedStage) -> CreditHold | None:
        """For a shared-memory chunk to a stage whose inbox reports takes: what returns the sender's credit."""
        if ref.buffer is None or sender == COORDINATOR or not stage.reports_takes:
            return None
        message = m.CreditReturn(
            request_id=request_id, from_stage=stage.address, to_stage=sender, object_id=ref.object_id
        )
        return CreditHold(self._releases, self._placement.process_of(sender), message)
