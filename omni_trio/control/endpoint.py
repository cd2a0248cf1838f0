"""One process's end of the control and data planes.

Every process of a pipeline (the caller's "main" process and each worker) has one
:class:`Endpoint`. It puts together parts with one job each, every one built with what it needs:
:class:`~omni_trio.control.peers.Peers` (the process's inbox, a link to each peer process, where
each peer is reached), a :class:`~omni_trio.control.dispatch.Dispatcher` (receive loops and the
handler of each message type), a :class:`~omni_trio.control.sending.Sender` (writes what the
stages here send to other processes: relays, slot allocators, TCP credits, transport logs), a
:class:`~omni_trio.control.receiving.Receiver` (reads, ACKs and delivers what arrives for the stages
here), :class:`~omni_trio.control.transfers.Transfers` (puts waiting for their ACK, credits
receivers hold), a :class:`~omni_trio.control.releases.ReleaseSender` (slot releases and credit
returns posted from any thread) and a :class:`~omni_trio.control.audit.HeldReporter` (the abort
safety net's reports). Aborts arrive on the inbox too, behind whatever the sender sent before them
(see :mod:`omni_trio.control.aborts`).

The stages' :mod:`omni_trio.control.links` (the edges to peers in other processes) send through
the endpoint. Other components register through :meth:`Endpoint.on`, :meth:`Endpoint.host` and
:meth:`Endpoint.on_submit_failure`; nothing outside assigns its attributes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import trio
import zmq

from omni_trio.comm.alloc import SlotAllocator
from omni_trio.comm.bulk import BulkFetcher, BulkServer
from omni_trio.comm.dataref import DataRef, DataRefKind
from omni_trio.comm.router import TransportLog
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.control.audit import HeldReporter
from omni_trio.control.dispatch import Dispatcher
from omni_trio.control.hosted import HostedStage
from omni_trio.control.hosting import HostedStages, Placement
from omni_trio.control.peers import Peers
from omni_trio.control.receiving import COORDINATOR, Receiver, chunk_list
from omni_trio.control.releases import CreditHold, ReleaseSender
from omni_trio.control.sending import Sender
from omni_trio.control.sockets.base import Inbox, Link, SocketBackend
from omni_trio.control.sockets.host import HostSockets
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.tasks import EndpointTasks
from omni_trio.control.transfers import Transfers
from omni_trio.control.wire import messages as m
from omni_trio.tracing.trace import Tracer

__all__ = [
    "COORDINATOR",
    "Endpoint",
    "chunk_list",
]

M = TypeVar("M", bound=m.ControlMessage)


class _HeldRequests:
    """What the abort safety net reports: the requests the stages here hold, told to ``main``."""

    def __init__(self, process: str, stages: HostedStages, peers: Peers) -> None:
        self._process = process
        self._stages = stages
        self._peers = peers

    def held(self) -> list[str]:
        return self._stages.held()

    async def report(self, held: list[str]) -> None:
        with contextlib.suppress(trio.ClosedResourceError):  # closing: nothing is held for long now
            await self._peers.send("main", m.HeldReport(process=self._process, request_ids=held))


class Endpoint:
    """The control/data-plane endpoint of one process (see the module docstring).

    ``sockets`` makes its sockets (:class:`~omni_trio.control.sockets.host.HostSockets`, or the
    in-memory backend in unit tests); a worker that joined over TCP passes the ``inbox`` it bound.
    """

    def __init__(
        self,
        *,
        process: str,
        sockets: SocketBackend,
        placement: dict[str, str],
        shm_prefix: str,
        tracer: Tracer,
        credits: dict[str, int] | None = None,
        max_transfer_bytes: dict[str, int] | None = None,
        gpu_stages: frozenset[str] = frozenset(),
        pool_bytes: dict[str, int] | None = None,
        tcp: dict[str, str] | None = None,
        inbox: Inbox | None = None,
        far: frozenset[str] = frozenset(),
        tcp_peers: frozenset[str] = frozenset(),
    ) -> None:
        self.process = process
        self.placement = placement
        self._sockets = sockets
        self._tasks = EndpointTasks()
        self._stages = HostedStages(process)
        self._placement = Placement(placement)
        self._segments = SegmentCache()
        self._peers = Peers(
            process=process,
            # The processes of the run: the only peers a message goes to.
            processes=frozenset({"main", *placement.values()}),
            sockets=sockets,
            tcp=tcp,
            inbox=inbox,
            tcp_peers=tcp_peers,
        )
        self._transfers = Transfers(self._stages)
        policy = sockets.policy
        # Tensors to and from other hosts: offered here, fetched from their senders (omni_trio.comm.bulk).
        self._bulk = BulkServer(
            policy.auth.secret,
            process=process,
            proof_timeout_s=policy.limits.proof_timeout_s,
            max_unproven=policy.limits.max_unproven_connections,
        )
        self._fetcher = BulkFetcher(policy.auth.secret, process=process)
        self._releases = ReleaseSender(process, self._peers, self._tasks)
        self._dispatcher = Dispatcher(process)
        self._sender = Sender(
            shm_prefix=shm_prefix,
            tracer=tracer,
            placement=self._placement,
            peers=self._peers,
            tasks=self._tasks,
            transfers=self._transfers,
            credits=credits or {},
            max_transfer_bytes=max_transfer_bytes or {},
            pool_bytes=pool_bytes or {},
            gpu_stages=gpu_stages,
            far=far,
            bulk=self._bulk,
        )
        self._receiver = Receiver(
            stages=self._stages,
            placement=self._placement,
            peers=self._peers,
            tasks=self._tasks,
            # Segments of this run, from any of its processes, start with this.
            run_prefix=shm_prefix.rsplit("-", 1)[0],
            segments=self._segments,
            releases=self._releases,
            tracer=tracer,
            bulk=self._fetcher,
        )
        self._reporter = HeldReporter(_HeldRequests(process, self._stages, self._peers))
        self.on(m.Submit, self._on_submit)
        self.on(m.DataReady, self._on_data_ready)
        self.on(m.DataAck, self._on_ack)
        self.on(m.CreditReturn, self._on_credit_return)
        self.on(m.SlotRelease, self._on_slot_release)
        self.on(m.Abort, self._on_abort)
        self.on(m.PeerAddresses, self._on_peer_addresses)

    # ------------------------------------------------------------------ registration

    def on(self, message_type: type[M], handler: Callable[[M], Awaitable[None]]) -> None:
        """Handle every ``message_type`` message arriving here with ``handler``."""
        self._dispatcher.on(message_type, handler)

    def host(self, stages: Mapping[str, HostedStage]) -> None:
        """Deliver what arrives for these stages (they run in this process) to them."""
        self._stages.host(stages)

    def on_submit_failure(self, fail: Callable[[str, str], None]) -> None:
        """In the main process: ``fail(request_id, error)`` fails a request whose inputs were not delivered."""
        self._stages.on_submit_failure(fail)

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the receive socket and handle messages until :meth:`stop`; close everything after.

        Shielded from outside cancellation: while a pipeline shuts down (after
        Ctrl-C, a caller's cancel scope, a dead worker) its aborts and
        Shutdown messages still need the endpoint.
        """
        inbox = self._peers.open_inbox()

        def start() -> None:
            self._tasks.spawn(self._dispatcher.receive_loop, inbox, inbox.source)
            if self._peers.tcp_address is not None:
                self._serve_bulk(self._peers.tcp_address)  # a worker that joined over TCP
            if self.process != "main":
                self._tasks.spawn(self._reporter.run)

        try:
            await self._tasks.serve(start, task_status)
        finally:
            await self._close()

    def begin_closing(self) -> None:
        """The process has begun to shut down: peers that are gone already are expected, not warned of."""
        self._sockets.begin_closing()

    def stop(self) -> None:
        """End :meth:`serve` (its sockets close, outstanding transfers are settled)."""
        self._tasks.stop()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the endpoint (it ends with the endpoint)."""
        self._tasks.spawn(fn, *args)

    async def _close(self) -> None:
        # Runs while the endpoint is being cancelled: nothing here may be skipped.
        with trio.CancelScope(shield=True):
            self._transfers.close()
            await self._sender.aclose()
            # Views already handed out keep their mappings; releases are moot
            # now (each sender unlinks its own slots when it closes).
            self._segments.clear()
            self._releases.clear()
            self._fetcher.close()
            self._peers.close()

    # ------------------------------------------------------------------ messages and objects

    async def send(self, process: str, message: m.ControlMessage) -> None:
        """Send one control message to ``process`` (:meth:`Peers.send <omni_trio.control.peers.Peers.send>`)."""
        await self._peers.send(process, message)

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
    ) -> None:
        """Write an object for a stage (or the coordinator) in another process and send ``make(data_ref)``
        (:meth:`Sender.send_object <omni_trio.control.sending.Sender.send_object>`)."""
        await self._sender.send_object(
            obj, request_id=request_id, sender=sender, receiver=receiver, kind=kind, direction=direction, make=make
        )

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
        """Send consecutive stream chunks in few messages
        (:meth:`Sender.send_chunks <omni_trio.control.sending.Sender.send_chunks>`)."""
        await self._sender.send_chunks(
            chunks, first_id, request_id=request_id, sender=sender, receiver=receiver, make=make
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
        """Read the object a message points to (ACKing shared memory) and deliver it in arrival order
        (:meth:`Receiver.receive_object <omni_trio.control.receiving.Receiver.receive_object>`)."""
        await self._receiver.receive_object(
            ref, request_id, sender, receiver, deliver, chunk_ids=chunk_ids, credit=credit
        )

    # ------------------------------------------------------------------ sockets

    @property
    def policy(self) -> SocketPolicy:
        """The run's proof and size cap, for every socket of this process."""
        return self._sockets.policy

    def listen_tcp(self, address: str) -> str:
        """Receive also at the ``tcp://`` ``address`` (CURVE; peers on other hosts); return where."""
        sock = self._peers.listen_tcp(address)
        self._tasks.spawn(self._dispatcher.receive_loop, sock, sock.source)
        self._serve_bulk(sock.source)
        return sock.source

    def _serve_bulk(self, address: str) -> None:
        """Offer the tensors sent to other hosts on a bulk listener at the host of ``address`` (once)."""
        if self._bulk.address is None:
            host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
            self._bulk.bind(host)
            self._tasks.spawn(self._bulk.serve)

    def receive_also(self, address: str, admit: Callable[[], bool]) -> Inbox:
        """Receive also on a socket of its own bound at the ``tcp://`` ``address`` (CURVE): its messages
        are handled like the others while ``admit()`` says so; :meth:`release` closes it."""
        sock = self._peers.bind(address)
        self._tasks.spawn(self._dispatcher.receive_loop, sock, sock.source, admit)
        return sock

    def learn_address(self, process: str, address: str) -> None:
        """``process`` (one of the run's) is reached over TCP at ``address`` (a new address, after a
        restart, replaces the connection to the old one)."""
        self._peers.learn_address(process, address)

    def release(self, sock: Link | Inbox) -> None:
        """Close ``sock`` (one :meth:`adopt` took) now."""
        self._peers.release(sock)

    def adopt(self, sock: Link | Inbox) -> None:
        """Close ``sock`` with the endpoint."""
        self._peers.adopt(sock)

    def forget_peer(self, process: str) -> None:
        """``process`` is gone: settle the transfers waiting for its stages' ACKs (none will come; their
        requests fail with it) and give back the credits they held; a process on another host is
        forgotten too (its next incarnation joins at an address of its own)."""
        self._transfers.forget_receivers(self._placement.stages_in(process))
        self._peers.forget(process)

    @property
    def context(self) -> zmq.Context[Any]:
        """The ZMQ context of the real backend's ``tcp://`` sockets (for sockets another component opens
        beside them: :meth:`adopt`)."""
        if not isinstance(self._sockets, HostSockets):
            raise LookupError(f"the sockets of process {self.process!r} have no ZMQ context")
        return self._sockets.context

    @property
    def tcp_address(self) -> str | None:
        """Where this process receives over TCP (None: on this host only)."""
        return self._peers.tcp_address

    @property
    def tcp_addresses(self) -> dict[str, str]:
        """The ``tcp://`` addresses of the peers known to be on other hosts."""
        return self._peers.tcp_addresses

    @property
    def refused(self) -> int:
        """Messages this process refused (:attr:`Peers.refused <omni_trio.control.peers.Peers.refused>`), and
        records of bulk connections that did not open (:attr:`BulkFetcher.refused
        <omni_trio.comm.bulk.BulkFetcher.refused>`)."""
        return self._peers.refused + self._fetcher.refused

    @property
    def refused_connections(self) -> int:
        """Connections this process's inboxes closed for their limits
        (:attr:`Peers.refused_connections <omni_trio.control.peers.Peers.refused_connections>`), and those
        its bulk listener refused (:attr:`BulkServer.refused <omni_trio.comm.bulk.BulkServer.refused>`)."""
        return self._peers.refused_connections + self._bulk.refused

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's inbox (a dead worker)."""
        return self._peers.undeliverable

    # ------------------------------------------------------------------ the stages' sending side

    def allocator(self, sender: str) -> SlotAllocator:
        """Where ``ot.empty`` in ``sender``'s compute takes its slots (``sender``'s relay); call on the loop."""
        return self._sender.allocator(sender)

    def transports(self, sender: str) -> TransportLog:
        """The transport log of ``sender``'s outgoing edges."""
        return self._sender.transports(sender)

    def relay_in_use(self, sender: str) -> int:
        """Transfers sent by ``sender`` that wait for their ACK."""
        return self._transfers.in_use(sender)

    def return_held_credits(self, sender: str, request_id: str) -> None:
        """``sender`` dropped ``request_id`` (abort, failure): give back the credits its receivers hold."""
        self._transfers.return_held(sender, request_id)

    def stage_idle(self) -> None:
        """A stage here let go of the last request it held: if none holds any, no report is due."""
        if not self._stages.any_active():
            self._reporter.settle()

    # ------------------------------------------------------------------ message handlers

    async def _on_submit(self, message: m.Submit) -> None:
        self._reporter.want()  # the safety net reports what the stages hold, in a while
        await self._receiver.on_submit(message)

    async def _on_data_ready(self, message: m.DataReady) -> None:
        self._reporter.want()
        await self._receiver.on_data_ready(message)

    async def _on_abort(self, message: m.Abort) -> None:
        self._stages.abort(message.request_ids)
        if self.process != "main":
            await self._peers.send("main", m.AbortDone(token=message.token, process=self.process))

    async def _on_ack(self, message: m.DataAck) -> None:
        self._transfers.on_ack(message)

    async def _on_credit_return(self, message: m.CreditReturn) -> None:
        self._transfers.on_credit_return(message)

    async def _on_slot_release(self, message: m.SlotRelease) -> None:
        self._sender.on_slot_release(message)

    async def _on_peer_addresses(self, message: m.PeerAddresses) -> None:
        self._peers.on_peer_addresses(message)
