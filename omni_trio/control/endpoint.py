"""One process's end of the control and data planes.

Every process of a pipeline (the caller's "main" process and each worker)
has one :class:`Endpoint`: a PULL socket ``<process>.sock`` in the run's IPC
directory that receives every control message for the process, one PUSH
socket per peer process, the shared-memory relay for the data it sends, and
the table of transfers waiting for their ACK. Aborts arrive on the
broadcast channel (PUB/SUB).

The endpoint turns messages into calls on the stages it hosts (the same
``on_submit``/``deliver_*``/``on_abort`` methods same-process links call),
and carries what their :mod:`omni_trio.control.links` (the edges to peers in
other processes) send.

A malformed, truncated or unknown frame is logged with the socket it came
from and dropped; it never ends the receive loop.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio
import zmq

from omni_trio.comm.dataref import DataRef, DataRefKind
from omni_trio.comm.router import TransportLog
from omni_trio.comm.shm import DEFAULT_POOL_BYTES, SegmentCache, ShmPut, ShmRelay
from omni_trio.comm.transfer import decode_object, encode_inline, encode_object
from omni_trio.control import messages as m
from omni_trio.control.codec import MalformedMessage, decode, encode
from omni_trio.control.lanes import Lanes
from omni_trio.control.zmq_trio import TrioSocket, bind_pull, connect_push
from omni_trio.payload import StagePayload, StreamItem
from omni_trio.stage.replicas import logical_name
from omni_trio.stage.stage import describe_error
from omni_trio.tracing import Tracer, get_logger

if TYPE_CHECKING:
    from omni_trio.stage.stage import Stage

log = get_logger(__name__)

#: The sender's name for data the coordinator sends (submitted inputs) and the
#: receiver's name for data sent to it (terminal results, chunks for the caller).
COORDINATOR = "coordinator"
#: How long a sender waits for the receiver's ACK of one shared-memory transfer.
ACK_TIMEOUT_S = 30.0
#: Messages taken from a socket per wake-up, at most.
RECEIVE_BATCH = 64
#: The topic of abort messages on the broadcast channel (not a message tag:
#: frames of a message sent point to point never start with it).
ABORT_TOPIC = b"omni-trio.abort"


def socket_path(ipc_dir: Path, process: str) -> Path:
    """Where ``process`` receives its control messages."""
    return ipc_dir / f"{process}.sock"


def abort_path(ipc_dir: Path) -> Path:
    """The broadcast channel for aborts."""
    return ipc_dir / "abort.sock"


def ready_topic(process: str) -> bytes:
    """The subscription a worker adds after the abort topic, so the publisher can
    see (through XPUB) that the worker's subscription to aborts is in place."""
    return b"ready:" + process.encode()


def _elapsed_ms(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 6)


@attrs.define(eq=False)
class _PendingTransfer:
    relay: ShmRelay
    put: ShmPut
    request_id: str
    sender: str
    receiver: str
    acked: trio.Event = attrs.field(factory=trio.Event)
    error: str | None = None


@attrs.define(eq=False)
class _HeldCredit:
    """A credit of ``relay`` for ``receiver`` that an ACK said the receiver holds until its scheduler
    takes the object (a :class:`~omni_trio.control.messages.CreditReturn` gives it back)."""

    relay: ShmRelay
    request_id: str
    sender: str
    receiver: str


class _CreditHold:
    """Receiving side: sends the :class:`~omni_trio.control.messages.CreditReturn` of one object, once.

    :meth:`give_back` may run on any thread (a scheduler thread taking the
    chunk from its inbox): it only hands the message to the endpoint's loop.
    """

    def __init__(self, endpoint: Endpoint, process: str, message: m.CreditReturn) -> None:
        self._endpoint = endpoint
        self._token = trio.lowlevel.current_trio_token()
        self._process = process
        self._message = message
        self._done = False

    def cancel(self) -> None:
        """Nothing to give back (the read failed: the failure ACK returned the credit)."""
        self._done = True

    def give_back(self) -> None:
        """Return the sender's credit (idempotent; a no-op once the loop has ended)."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._endpoint._queue_release, self._process, self._message)


class Endpoint:
    """The control/data-plane endpoint of one process (see the module docstring)."""

    def __init__(
        self,
        *,
        process: str,
        ipc_dir: Path,
        placement: dict[str, str],
        shm_prefix: str,
        tracer: Tracer,
        credits: dict[str, int] | None = None,
        max_transfer_bytes: dict[str, int] | None = None,
        gpu_stages: frozenset[str] = frozenset(),
        pool_bytes: dict[str, int] | None = None,
    ) -> None:
        self.process = process
        self.ipc_dir = ipc_dir
        self.placement = placement
        self.shm_prefix = shm_prefix
        #: Segments of this run, from any of its processes, start with this.
        self.run_prefix = shm_prefix.rsplit("-", 1)[0]
        self.tracer = tracer
        self.stages: dict[str, Stage] = {}
        #: Handlers of messages only one side of the pipeline expects (coordinator
        #: reports in main, shutdown and stats requests in workers), by message type.
        self.handlers: dict[type[m.ControlMessage], Callable[[Any], Awaitable[None]]] = {}
        #: In the main process: fails a request whose submitted inputs could not be delivered.
        self.fail_submitted: Callable[[str, str], None] | None = None
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._pull: TrioSocket | None = None
        self._push: dict[str, TrioSocket] = {}
        self._adopted: list[TrioSocket] = []
        self._relays: dict[str, ShmRelay] = {}
        self._gpu_stages = gpu_stages
        self._credits = credits or {}
        self._max_transfer = max_transfer_bytes or {}
        self._pool_bytes = pool_bytes or {}
        self._pending: dict[str, _PendingTransfer] = {}
        # Sending: credits that receivers hold until their scheduler takes the object, by object id.
        self._held: dict[str, _HeldCredit] = {}
        # Receiving: mappings of peers' pooled slots; slot releases waiting to be sent.
        self._segments = SegmentCache()
        self._releases: deque[tuple[str, m.ControlMessage]] = deque()
        self._releasing = False
        self.handlers[m.SlotRelease] = self._on_slot_release
        self.handlers[m.CreditReturn] = self._on_credit_return
        self._transports: dict[str, TransportLog] = {}
        self._sequence = itertools.count()
        self._lanes = Lanes()
        self._nursery: trio.Nursery | None = None
        self._serving = trio.CancelScope(shield=True)

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the receive socket and handle messages until :meth:`stop`; close everything after.

        Shielded from outside cancellation: while a pipeline shuts down (after
        Ctrl-C, a caller's cancel scope, a dead worker) its aborts and
        Shutdown messages still need the endpoint.
        """
        self._pull = bind_pull(self._ctx, socket_path(self.ipc_dir, self.process))
        try:
            with self._serving:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._receive_loop, self._pull, str(socket_path(self.ipc_dir, self.process)))
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            await self._close()

    def stop(self) -> None:
        """End :meth:`serve` (its sockets close, outstanding transfers are settled)."""
        self._serving.cancel()

    @property
    def context(self) -> zmq.Context[Any]:
        """The process's ZMQ context."""
        return self._ctx

    def adopt(self, sock: TrioSocket) -> None:
        """Close ``sock`` with the endpoint."""
        self._adopted.append(sock)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the endpoint (it ends with the endpoint)."""
        assert self._nursery is not None, "the endpoint is not serving"
        self._nursery.start_soon(fn, *args)

    async def _close(self) -> None:
        # Runs while the endpoint is being cancelled: nothing here may be skipped.
        with trio.CancelScope(shield=True):
            for pending in self._pending.values():
                pending.relay.settle(pending.put, False)
            self._pending.clear()
            self._held.clear()  # the relays close: nobody waits for a credit any more
            for relay in self._relays.values():
                await relay.aclose()
            # Views already handed out keep their mappings; releases are moot
            # now (each sender unlinks its own slots when it closes).
            self._segments.clear()
            self._releases.clear()
            for sock in [*self._push.values(), *self._adopted, *([self._pull] if self._pull else [])]:
                sock.close()
            self._push.clear()
            self._ctx.destroy(linger=0)

    # ------------------------------------------------------------------ sending

    def _socket_to(self, process: str) -> TrioSocket:
        sock = self._push.get(process)
        if sock is None:
            sock = self._push[process] = connect_push(self._ctx, socket_path(self.ipc_dir, process))
        return sock

    async def send(self, process: str, message: m.ControlMessage) -> None:
        """Send one control message to ``process``."""
        await self._socket_to(process).send_multipart(encode(message))

    def connect_abort_channel(self, sock: TrioSocket) -> None:
        """Handle aborts arriving on a subscribed broadcast socket (workers)."""
        self.spawn(self._receive_loop, sock, str(abort_path(self.ipc_dir)), True)

    def _relay(self, sender: str) -> ShmRelay:
        relay = self._relays.get(sender)
        if relay is None:
            relay = self._relays[sender] = ShmRelay(
                f"{self.shm_prefix}-{len(self._relays)}",
                credits_per_target=self._credits.get(sender, 2),
                max_transfer_bytes=self._max_transfer.get(sender, 512 << 20),
                pool_bytes=self._pool_bytes.get(sender, DEFAULT_POOL_BYTES),
            )
        return relay

    def relay_in_use(self, sender: str) -> int:
        """Transfers sent by ``sender`` that wait for their ACK."""
        return sum(1 for p in self._pending.values() if p.sender == sender)

    def transports(self, sender: str) -> TransportLog:
        """The transport log of ``sender``'s outgoing edges."""
        log_ = self._transports.get(sender)
        if log_ is None:
            log_ = self._transports[sender] = TransportLog(sender, self.tracer)
        return log_

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
        start = time.monotonic()
        object_id = f"{request_id}:{direction}:{sender}:{receiver}:{next(self._sequence)}"
        relay = self._relay(sender)
        gpu_peers = sender in self._gpu_stages and receiver in self._gpu_stages
        put: ShmPut | None = None
        if inline_only:
            inline = encode_inline(
                obj, sender=sender, target=receiver, object_id=object_id, kind=kind, gpu_peers=gpu_peers
            )
            if inline is None:
                return False
            ref = inline
        else:
            ref, put = await encode_object(
                obj, relay=relay, sender=sender, target=receiver, object_id=object_id, kind=kind, gpu_peers=gpu_peers
            )
        written = time.monotonic()
        self.transports(sender).note(direction, receiver, ref.transport.value)
        pending = None
        if put is not None:
            # Registered before sending: the ACK may arrive during the send's checkpoint.
            pending = self._pending[object_id] = _PendingTransfer(relay, put, request_id, sender, receiver)
        receiver_process = self.placement.get(receiver, "main") if receiver != COORDINATOR else "main"
        try:
            await self.send(receiver_process, make(ref.to_wire()))
        except BaseException:
            # Not sent (an abort cancelled it, or the socket failed): nobody will ACK.
            if pending is not None and self._pending.pop(object_id, None) is not None:
                relay.settle(pending.put, False)
            raise
        if pending is not None:
            self.spawn(self._await_ack, object_id, pending)
        if self.tracer.enabled:
            fields = {
                "request_id": request_id,
                "from_stage": sender,
                "to_stage": receiver,
                "transport": ref.transport.value,
                "bytes": ref.nbytes if put is not None else len(ref.header or b""),
                "write_ms": round((written - start) * 1000, 6),
                "control_send_ms": _elapsed_ms(written),
                "elapsed_ms": _elapsed_ms(start),
            }
            if chunk_ids is None:
                self.tracer.event("comm_payload_send", **fields)
            else:
                self.tracer.event("comm_stream_send", chunk_id=chunk_ids.start, chunk_count=len(chunk_ids), **fields)
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
        :data:`~omni_trio.control.messages.MAX_CHUNKS_PER_MESSAGE` in one inline
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

    async def _await_ack(self, object_id: str, pending: _PendingTransfer) -> None:
        with trio.move_on_after(ACK_TIMEOUT_S):
            await pending.acked.wait()
        if not pending.acked.is_set():
            if self._pending.pop(object_id, None) is None:
                return  # settled by the endpoint closing
            pending.error = f"no ACK from {pending.receiver!r} within {ACK_TIMEOUT_S:g} s"
            pending.relay.settle(pending.put, False)
        if pending.error is not None:
            await self.fail_request(
                pending.sender, pending.request_id, f"transfer to {pending.receiver!r} failed: {pending.error}"
            )

    async def fail_request(self, sender: str, request_id: str, error: str) -> None:
        """Fail ``request_id`` on behalf of a stage (or the coordinator) of this process."""
        stage = self.stages.get(sender)
        if stage is not None:
            await stage.send_failure(request_id, error)
        elif sender == COORDINATOR and self.fail_submitted is not None:
            self.fail_submitted(request_id, error)

    # ------------------------------------------------------------------ receiving

    async def _receive_loop(self, sock: TrioSocket, source: str, topic_frame: bool = False) -> None:
        while True:
            try:
                batch = [await sock.recv_multipart()]
                # Take everything already queued before handling any of it: a
                # burst reaches a scheduler's inbox together (and batches there).
                while len(batch) < RECEIVE_BATCH and (frames := sock.recv_nowait()) is not None:
                    batch.append(frames)
            except trio.ClosedResourceError:
                return
            for frames in batch:
                await self._handle_frames(frames[1:] if topic_frame else frames, source)

    async def _handle_frames(self, frames: list[bytes], source: str) -> None:
        try:
            message = decode(frames)
        except MalformedMessage as exc:
            log.warning("malformed_message_dropped", socket=source, process=self.process, reason=exc.reason)
            return
        try:
            await self._dispatch(message)
        except Exception as exc:  # noqa: BLE001 - one bad message must not end the receive loop
            log.warning(
                "message_dropped",
                socket=source,
                process=self.process,
                message=type(message).__name__,
                error=describe_error(exc),
            )

    async def _dispatch(self, message: m.ControlMessage) -> None:
        if isinstance(message, m.DataReady):
            await self._on_data_ready(message)
        elif isinstance(message, m.DataAck):
            self._on_ack(message)
        elif isinstance(message, m.Submit):
            await self._on_submit(message)
        elif isinstance(message, m.Abort):
            for stage in self.stages.values():
                stage.on_abort(message.request_id)
            if self.process != "main":
                await self.send("main", m.AbortDone(request_id=message.request_id, process=self.process))
        else:
            handler = self.handlers.get(type(message))
            if handler is None:
                raise ValueError(f"{type(message).__name__} is not expected by process {self.process!r}")
            await handler(message)

    def _stage(self, name: str) -> Stage:
        stage = self.stages.get(name)
        if stage is None:
            raise LookupError(f"stage {name!r} does not run in process {self.process!r}")
        return stage

    async def _on_submit(self, message: m.Submit) -> None:
        stage = self._stage(message.to_stage)
        ref = DataRef.from_wire(message.data_ref)

        async def deliver(payload: Any) -> None:
            await stage.on_submit(self._checked_payload(payload, message.request_id), message.replica_bindings)

        await self.receive_object(ref, message.request_id, COORDINATOR, message.to_stage, deliver)

    @staticmethod
    def _checked_payload(payload: Any, request_id: str) -> StagePayload:
        if not isinstance(payload, StagePayload) or payload.request_id != request_id:
            raise ValueError(f"expected the StagePayload of {request_id!r}, got {type(payload).__name__}")
        return payload

    async def _on_data_ready(self, message: m.DataReady) -> None:
        stage = self._stage(message.to_stage)
        # Addresses (``voc@r1``) route ACKs and credits; the stage sees the sender's stage name.
        rid, sender, receiver = message.request_id, message.from_stage, stage.address
        source, bindings = logical_name(sender), message.replica_bindings
        if message.is_signal:
            lane = (rid, sender, receiver)

            async def signal(_: Any) -> None:
                await stage.deliver_stream_signal(rid, source, message.error, bindings)

            await self._in_order(lane, _nothing, signal, needs_task=False)
            return
        ref = DataRef.from_wire(message.data_ref)
        if message.chunk_id is None:

            async def payload(value: Any) -> None:
                await stage.deliver_payload(rid, source, self._checked_payload(value, rid), bindings)

            await self.receive_object(ref, rid, sender, receiver, payload)
            return
        first, count = message.chunk_id, message.chunk_count
        # A shared-memory chunk holds the sender's credit until the scheduler takes it (docs/design.md §9).
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
        credit: _CreditHold | None = None,
    ) -> None:
        """Read the object ``ref`` points to (ACKing shared memory) and deliver it in lane order.

        With ``credit``, a successful ACK says the receiver holds the sender's
        credit, and ``deliver`` must see to it that ``credit`` is given back.
        """
        lane = (request_id, sender, receiver)

        async def read() -> Any:
            start = time.monotonic()
            try:
                value = await decode_object(
                    ref,
                    shm_prefix=self.run_prefix,
                    segments=self._segments,
                    on_release=self._slot_releaser(ref, sender, receiver),
                )
            except Exception as exc:
                if credit is not None:
                    credit.cancel()
                if ref.buffer is not None:
                    await self._ack(ref, request_id, sender, receiver, describe_error(exc))
                await self.fail_request(
                    receiver, request_id, f"reading data from {sender!r} failed: {describe_error(exc)}"
                )
                raise _ReadFailed from exc
            if ref.buffer is not None:
                await self._ack(ref, request_id, sender, receiver, None, credit_held=credit is not None)
            if self.tracer.enabled and chunk_ids is not None:
                self.tracer.event(
                    "comm_stream_read",
                    request_id=request_id,
                    from_stage=sender,
                    to_stage=receiver,
                    chunk_id=chunk_ids.start,
                    chunk_count=len(chunk_ids),
                    object_id=ref.object_id,
                    transport=ref.transport.value,
                    bytes=ref.nbytes or len(ref.header or b""),
                    elapsed_ms=_elapsed_ms(start),
                )
            return value

        await self._in_order(lane, read, deliver, needs_task=ref.buffer is not None)

    async def _in_order(
        self,
        lane: tuple[str, str, str],
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
        *,
        needs_task: bool,
    ) -> None:
        """Deliver in lane order: now if nothing is ahead and the read is instant, else in a task."""
        if not needs_task and self._lanes.idle(lane):
            with contextlib.suppress(_ReadFailed):
                await deliver(await read())
            return
        self.spawn(self._run_in_lane, lane, self._lanes.claim(lane), read, deliver)

    async def _run_in_lane(
        self,
        lane: tuple[str, str, str],
        place: tuple[trio.Event | None, trio.Event],
        read: Callable[[], Awaitable[Any]],
        deliver: Callable[[Any], Awaitable[None]],
    ) -> None:
        with contextlib.suppress(_ReadFailed):
            await self._lanes.run(lane, place, read, deliver)

    async def _ack(
        self, ref: DataRef, request_id: str, sender: str, receiver: str, error: str | None, *, credit_held: bool = False
    ) -> None:
        sender_process = "main" if sender == COORDINATOR else self.placement.get(sender, "main")
        ack = m.DataAck(
            request_id=request_id,
            from_stage=receiver,
            to_stage=sender,
            object_id=ref.object_id,
            success=error is None,
            error=error,
            credit_held=credit_held,
        )
        await self.send(sender_process, ack)

    def _on_ack(self, message: m.DataAck) -> None:
        # Settled here, not in the transfer's watcher task: a CreditReturn right behind this ACK
        # (same socket, same receive batch) must find the held credit.
        pending = self._pending.get(message.object_id)
        if pending is None or pending.sender != message.to_stage:
            return  # already settled (timed out, or the endpoint closed)
        del self._pending[message.object_id]
        hold = message.credit_held and not self._request_retired(pending.sender, pending.request_id)
        pending.relay.settle(pending.put, message.success, keep_credit=hold)
        if hold and message.success:
            self._held[message.object_id] = _HeldCredit(
                pending.relay, pending.request_id, pending.sender, pending.receiver
            )
        pending.error = message.error
        pending.acked.set()

    def _request_retired(self, sender: str, request_id: str) -> bool:
        stage = self.stages.get(sender)
        return stage is not None and request_id in stage.aborted

    async def _on_credit_return(self, message: m.CreditReturn) -> None:
        held = self._held.get(message.object_id)
        if held is None or held.sender != message.to_stage or held.receiver != message.from_stage:
            return  # returned already (the request ended), or not ours
        del self._held[message.object_id]
        held.relay.return_credit(held.receiver)

    def return_held_credits(self, sender: str, request_id: str) -> None:
        """``sender`` dropped ``request_id`` (abort, failure): give back the credits its receivers hold.

        A receiver returns them itself when it drops the request too; this covers
        a receiver that never will (its process died).
        """
        for object_id, held in list(self._held.items()):
            if held.sender == sender and held.request_id == request_id:
                del self._held[object_id]
                held.relay.return_credit(held.receiver)

    def held_credits(self, sender: str | None = None) -> int:
        """Credits of ``sender`` (or of every stage here) that receivers hold until their scheduler takes the object."""
        return sum(1 for held in self._held.values() if sender is None or held.sender == sender)

    def _credit_hold(self, ref: DataRef, request_id: str, sender: str, stage: Stage) -> _CreditHold | None:
        """For a shared-memory chunk to a stage whose inbox reports takes: what returns the sender's credit."""
        if ref.buffer is None or sender == COORDINATOR or not stage.reports_takes:
            return None
        message = m.CreditReturn(
            request_id=request_id, from_stage=stage.address, to_stage=sender, object_id=ref.object_id
        )
        return _CreditHold(self, self.placement.get(sender, "main"), message)

    def _slot_releaser(self, ref: DataRef, sender: str, receiver: str) -> Callable[[], None] | None:
        """For a pooled transfer: what tells ``sender`` that no tensor views its slot any more.

        The callback runs when the last such tensor dies, on any thread (a
        scheduler thread, the garbage collector): it only hands the message to
        this trio loop, never blocks, and does nothing once the loop is gone.
        """
        if ref.buffer is None or not ref.buffer.pooled:
            return None
        token = trio.lowlevel.current_trio_token()
        process = "main" if sender == COORDINATOR else self.placement.get(sender, "main")
        message = m.SlotRelease(
            from_stage=receiver, to_stage=sender, shm_name=ref.buffer.info["shm_name"], lease=ref.buffer.info["lease"]
        )

        def released() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._queue_release, process, message)

        return released

    def _queue_release(self, process: str, message: m.ControlMessage) -> None:
        """On the trio loop: queue a slot release (or a credit return); one task sends the queue in order."""
        # Runs as a run_sync_soon callback, where an exception would crash the trio run.
        nursery = self._nursery
        if nursery is None or self._serving.cancel_called:
            return  # closing: the sender unlinks its slots itself
        self._releases.append((process, message))
        if not self._releasing:
            try:
                nursery.start_soon(self._send_releases)
            except Exception:  # noqa: BLE001 - the nursery is closed: nobody to tell
                self._releases.clear()
                return
            self._releasing = True

    async def _send_releases(self) -> None:
        try:
            while self._releases:
                process, message = self._releases.popleft()
                try:
                    await self.send(process, message)
                except Exception as exc:  # noqa: BLE001 - a lost release costs a slot, never the loop
                    log.warning(
                        "slot_release_not_sent", process=self.process, to=process, error=describe_error(exc)
                    )
        finally:
            self._releasing = False

    async def _on_slot_release(self, message: m.SlotRelease) -> None:
        relay = self._relays.get(message.to_stage)
        if relay is not None:
            relay.release(message.shm_name, message.lease, message.from_stage)

    def pending_transfers(self) -> int:
        """Transfers of this process waiting for their ACK."""
        return len(self._pending)

    def busy_lanes(self) -> int:
        """Lanes with a read or delivery in progress."""
        return len(self._lanes)


def chunk_list(value: object, count: int) -> list[Any]:
    """The data of a chunk message: a list of ``count`` items (else ValueError)."""
    if type(value) is not list or len(value) != count:
        raise ValueError(f"expected a list of {count} chunk(s), got {type(value).__name__}")
    return value


async def _send_group(group: list[Any], first_id: int, send: Callable[[list[Any], int, bool], Awaitable[bool]]) -> None:
    if len(group) == 1:
        await send(group, first_id, False)
    elif not await send(group, first_id, True):
        half = len(group) // 2
        await _send_group(group[:half], first_id, send)
        await _send_group(group[half:], first_id + half, send)


class _ReadFailed(Exception):
    """Reading an object failed; the request was failed and the sender ACKed."""


async def _nothing() -> None:
    return None
