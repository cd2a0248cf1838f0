"""Sending side of the data plane: write an object for a stage in another process, send its message.

:class:`Sender` keeps, for each sending stage (or replica address) of its process, the
shared-memory :class:`~omni_trio.comm.shm.ShmRelay` its objects go through, the
:class:`~omni_trio.comm.alloc.SlotAllocator` its compute builds outputs in, the
:class:`~omni_trio.comm.tcp.TcpCredits` of its transfers to other hosts and the
:class:`~omni_trio.comm.router.TransportLog` of its edges. An object travels inline, through
shared memory or over TCP (:func:`~omni_trio.comm.transfer.encode_object`); a transfer that waits
for its ACK is tracked in :class:`~omni_trio.control.transfers.Transfers` from before its message
is sent.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from omni_trio.comm.alloc import SlotAllocator
from omni_trio.comm.bulk import BulkServer
from omni_trio.comm.dataref import DataRefKind
from omni_trio.comm.router import TransportLog, TransportLogs
from omni_trio.comm.shm import ShmPut, ShmRelay
from omni_trio.comm.slotpool import DEFAULT_POOL_BYTES
from omni_trio.comm.tcp import TcpCredits, TcpPut
from omni_trio.comm.transfer import encode_inline, encode_object, tensor_bytes
from omni_trio.control.hosting import Placement
from omni_trio.control.peers import Peers
from omni_trio.control.sockets import write_batch
from omni_trio.control.tasks import EndpointTasks
from omni_trio.control.transfers import Transfers
from omni_trio.control.wire import messages as m
from omni_trio.tracing.trace import Tracer


def _elapsed_ms(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 6)


class Sender:
    """Writes the objects one process's stages send to other processes (see the module docstring).

    Built with: the process's segment prefix ``shm_prefix``, the tracer, the run's ``placement``,
    the process's ``peers`` (what sends), the endpoint's ``tasks`` and
    :class:`~omni_trio.control.transfers.Transfers`, and per sending stage its ``credits`` per
    target, ``max_transfer_bytes`` and ``pool_bytes``; ``gpu_stages`` name the GPU stages (CUDA
    tensors between two of them are copied through host memory, said once per edge), and objects
    to a process in ``far`` (on another host) go over TCP, their tensors offered on ``bulk``.
    """

    def __init__(
        self,
        *,
        shm_prefix: str,
        tracer: Tracer,
        placement: Placement,
        peers: Peers,
        tasks: EndpointTasks,
        transfers: Transfers,
        credits: dict[str, int],
        max_transfer_bytes: dict[str, int],
        pool_bytes: dict[str, int],
        gpu_stages: frozenset[str],
        far: frozenset[str],
        bulk: BulkServer,
    ) -> None:
        self._shm_prefix = shm_prefix
        self._bulk = bulk
        self._tracer = tracer
        self._placement = placement
        self._peers = peers
        self._tasks = tasks
        self._transfers = transfers
        self._credits = credits
        self._max_transfer = max_transfer_bytes
        self._pool_bytes = pool_bytes
        self._gpu_stages = gpu_stages
        self._far = far
        self._relays: dict[str, ShmRelay] = {}
        self._allocators: dict[str, SlotAllocator] = {}
        self._tcp_credits: dict[str, TcpCredits] = {}
        self._transports = TransportLogs(tracer)
        self._sequence = itertools.count()

    def _relay(self, sender: str) -> ShmRelay:
        relay = self._relays.get(sender)
        if relay is None:
            relay = self._relays[sender] = ShmRelay(
                f"{self._shm_prefix}-{len(self._relays)}",
                credits_per_target=self._credits.get(sender, 2),
                max_transfer_bytes=self._max_transfer.get(sender, 512 << 20),
                pool_bytes=self._pool_bytes.get(sender, DEFAULT_POOL_BYTES),
            )
        return relay

    def allocator(self, sender: str) -> SlotAllocator:
        """Where ``ot.empty`` in ``sender``'s compute takes its slots (``sender``'s relay); call on the loop."""
        allocator = self._allocators.get(sender)
        if allocator is None:
            allocator = self._allocators[sender] = SlotAllocator(
                functools.partial(self._open_relay, sender), stage=sender, tracer=self._tracer
            )
        return allocator

    def _open_relay(self, sender: str) -> ShmRelay | None:
        """``sender``'s relay, or None once the endpoint is stopping (its relays are closed or closing)."""
        return None if self._tasks.closing else self._relay(sender)

    def _tcp_credits_of(self, sender: str) -> TcpCredits:
        credits = self._tcp_credits.get(sender)
        if credits is None:
            credits = self._tcp_credits[sender] = TcpCredits(self._credits.get(sender, 2), self._bulk)
        return credits

    def transports(self, sender: str) -> TransportLog:
        """The transport log of ``sender``'s outgoing edges."""
        return self._transports.of(sender)

    async def send_object(
        self,
        obj: object,
        *,
        request_id: str,
        sender: str,
        receiver: str,
        kind: DataRefKind,
        direction: str,
        make: Callable[[dict[str, Any]], m.ControlMessage],
        chunk_ids: range | None = None,
        inline_only: bool = False,
    ) -> bool:
        """Write ``obj`` for ``receiver`` (inline or shared memory) and send the message ``make(data_ref)``.

        A shared-memory transfer is tracked until its ACK; a failed or missing
        ACK fails ``request_id`` at ``sender``. With ``inline_only`` an object
        that would not travel inline is not sent: the result is False.
        """
        tracing = self._tracer.enabled
        start = time.monotonic() if tracing else 0.0
        object_id = f"{request_id}:{direction}:{sender}:{receiver}:{next(self._sequence)}"
        relay = self._relay(sender)
        gpu_peers = sender in self._gpu_stages and receiver in self._gpu_stages
        put: ShmPut | TcpPut | None = None
        far = self._placement.process_of(receiver) in self._far
        if inline_only:
            inline = encode_inline(
                obj, sender=sender, target=receiver, object_id=object_id, kind=kind, gpu_peers=gpu_peers
            )
            if inline is None:
                return False
            ref = inline
        else:
            ref, put = await encode_object(
                obj,
                relay=relay,
                sender=sender,
                target=receiver,
                object_id=object_id,
                kind=kind,
                gpu_peers=gpu_peers,
                allocator=None if far else self._allocators.get(sender),
                tcp=self._tcp_credits_of(sender) if far else None,
            )
        written = time.monotonic() if tracing else 0.0
        self.transports(sender).note(direction, receiver, ref.transport.value, ref.tensor_bytes)
        pending = None
        if put is not None:
            # Registered before sending: the ACK may arrive during the send's checkpoint.
            settles = self._tcp_credits_of(sender) if isinstance(put, TcpPut) else relay
            pending = self._transfers.track(object_id, settles, put, request_id, sender, receiver)
        # Inline, nothing this process waits for depends on the message: it may wait in a drain's batch.
        holdable = write_batch.holdable() if put is None else contextlib.nullcontext()
        try:
            with holdable:
                await self._peers.send(self._placement.process_of(receiver), make(ref.to_wire()))
        except BaseException:
            # Not sent (an abort cancelled it, or the socket failed): nobody will ACK.
            if pending is not None:
                self._transfers.not_sent(object_id)
            raise
        if pending is not None:
            self._tasks.spawn(self._transfers.watch, object_id, pending)
        if tracing:
            fields = {
                "request_id": request_id,
                "from_stage": sender,
                "to_stage": receiver,
                "transport": ref.transport.value,
                "wire_bytes": ref.wire_bytes,
                "write_ms": round((written - start) * 1000, 6),
                "control_send_ms": _elapsed_ms(written),
                "elapsed_ms": _elapsed_ms(start),
            }
            if chunk_ids is None:
                self._tracer.event("comm_payload_send", bytes=tensor_bytes(obj), **fields)
            else:
                sizes = [tensor_bytes(chunk) for chunk in obj]  # type: ignore[attr-defined]  # a list of chunks
                self._tracer.event(
                    "comm_stream_send",
                    chunk_id=chunk_ids.start,
                    chunk_count=len(chunk_ids),
                    bytes=sum(sizes),
                    chunk_bytes=sizes,
                    **fields,
                )
        return True

    async def send_chunks(
        self,
        chunks: list[Any],
        first_id: int,
        *,
        request_id: str,
        sender: str,
        receiver: str,
        make: Callable[[dict[str, Any], int, int], m.ControlMessage],
    ) -> None:
        """Send consecutive stream chunks ``first_id, ...`` in few messages, each ``make(data_ref, first, count)``.

        Small chunks travel together, up to
        :data:`~omni_trio.control.wire.messages.MAX_CHUNKS_PER_MESSAGE` in one inline
        message; a group too big to go inline is halved until it does, down to
        single chunks that go by their own transport (so a chunk that needs shared
        memory travels alone, as it would without its neighbours).
        """

        async def send(group: list[Any], group_first: int, inline_only: bool) -> bool:
            return await self.send_object(
                group,
                request_id=request_id,
                sender=sender,
                receiver=receiver,
                kind=DataRefKind.stream_chunk,
                direction="stream",
                chunk_ids=range(group_first, group_first + len(group)),
                inline_only=inline_only,
                make=lambda ref: make(ref, group_first, len(group)),
            )

        for start in range(0, len(chunks), m.MAX_CHUNKS_PER_MESSAGE):
            await _send_group(chunks[start : start + m.MAX_CHUNKS_PER_MESSAGE], first_id + start, send)

    def on_slot_release(self, message: m.SlotRelease) -> None:
        """A receiver no longer views a pooled slot of the sending stage's relay: it is free again."""
        relay = self._relays.get(message.to_stage)
        if relay is not None:
            relay.release(message.shm_name, message.lease, message.from_stage)

    async def aclose(self) -> None:
        """Close every relay (each unlinks its slots, free or lent)."""
        for relay in self._relays.values():
            await relay.aclose()


async def _send_group(group: list[Any], first_id: int, send: Callable[[list[Any], int, bool], Awaitable[bool]]) -> None:
    if len(group) == 1:
        await send(group, first_id, False)
    elif not await send(group, first_id, True):
        half = len(group) // 2
        await _send_group(group[:half], first_id, send)
        await _send_group(group[half:], first_id + half, send)
