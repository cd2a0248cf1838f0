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
from pathlib import Path
from typing import Any, TypeVar

import trio
import zmq

from omni_trio.comm.alloc import SlotAllocator
from omni_trio.comm.router import TransportLog
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.control.audit import HeldReporter
from omni_trio.control.dispatch import Dispatcher
from omni_trio.control.hosted import HostedStage
from omni_trio.control.peers import Peers
from omni_trio.control.receiving import COORDINATOR, Receiver, chunk_list
from omni_trio.control.releases import ReleaseSender
from omni_trio.control.sending import Sender
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.transfers import Transfers
from omni_trio.control.wire import messages as m
from omni_trio.errors import describe_error
from omni_trio.tracing.trace import Tracer

__all__ = [
    "COORDINATOR",
    "Endpoint",
    "chunk_list",
]

M = TypeVar("M", bound=m.ControlMessage)


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
        policy: SocketPolicy,
        credits: dict[str, int] | None = None,
        max_transfer_bytes: dict[str, int] | None = None,
        gpu_stages: frozenset[str] = frozenset(),
        pool_bytes: dict[str, int] | None = None,
        tcp: dict[str, str] | None = None,
        context: zmq.Context[Any] | None = None,
        pull: TrioSocket | None = None,
        far: frozenset[str] = frozenset(),
        tcp_peers: frozenset[str] = frozenset(),
    ) -> None:
        self.process = process
        self.placement = placement
        #: The run's proof and size cap, for every socket of this process.
        self.policy = policy
        self._stages: dict[str, HostedStage] = {}
        self._fail_submitted: Callable[[str, str], None] | None = None
        self._nursery: trio.Nursery | None = None
        self._serving = trio.CancelScope(shield=True)
        self._segments = SegmentCache()
        self._peers = Peers(
            process=process,
            ipc_dir=ipc_dir,
            # The processes of the run: the only peers a message goes to.
            processes=frozenset({"main", *placement.values()}),
            policy=policy,
            tcp=tcp,
            context=context,
            pull=pull,
            tcp_peers=tcp_peers,
        )
        self._transfers = Transfers(self._fail_request, self._request_retired)
        self._releases = ReleaseSender(process, self._peers.send, self.spawn, self._closing)
        self._dispatcher = Dispatcher(process, describe_error)
        self._sender = Sender(
            shm_prefix=shm_prefix,
            tracer=tracer,
            process_of=self._process_of,
            send=self._peers.send,
            spawn=self.spawn,
            transfers=self._transfers,
            closing=self._closing,
            credits=credits or {},
            max_transfer_bytes=max_transfer_bytes or {},
            pool_bytes=pool_bytes or {},
            gpu_stages=gpu_stages,
            far=far,
        )
        self._receiver = Receiver(
            stage=self._stage,
            process_of=self._process_of,
            send=self._peers.send,
            fail_request=self._fail_request,
            spawn=self.spawn,
            # Segments of this run, from any of its processes, start with this.
            run_prefix=shm_prefix.rsplit("-", 1)[0],
            segments=self._segments,
            releases=self._releases,
            tracer=tracer,
            describe=describe_error,
        )
        self._reporter = HeldReporter(self._held, self._report_held)
        # Every message goes through these: they are the parts' own methods, so that no call of
        # the endpoint's stands between a link and the part.
        #: Send one control message to a process (:meth:`Peers.send <omni_trio.control.peers.Peers.send>`).
        self.send = self._peers.send
        #: Write an object for a stage in another process and send its message
        #: (:meth:`Sender.send_object <omni_trio.control.sending.Sender.send_object>`).
        self.send_object = self._sender.send_object
        #: Send consecutive stream chunks in few messages
        #: (:meth:`Sender.send_chunks <omni_trio.control.sending.Sender.send_chunks>`).
        self.send_chunks = self._sender.send_chunks
        #: Read the object a message points to (ACKing shared memory) and deliver it in lane order
        #: (:meth:`Receiver.receive_object <omni_trio.control.receiving.Receiver.receive_object>`).
        self.receive_object = self._receiver.receive_object
        self.on(m.Submit, self._arrived(self._receiver.on_submit))
        self.on(m.DataReady, self._arrived(self._receiver.on_data_ready))
        self.on(m.DataAck, self._on_ack)
        self.on(m.CreditReturn, self._on_credit_return)
        self.on(m.SlotRelease, self._sender.on_slot_release)
        self.on(m.Abort, self._on_abort)
        self.on(m.PeerAddresses, self._peers.on_peer_addresses)

    # ------------------------------------------------------------------ registration

    def on(self, message_type: type[M], handler: Callable[[M], Awaitable[None]]) -> None:
        """Handle every ``message_type`` message arriving here with ``handler``."""
        self._dispatcher.on(message_type, handler)

    def host(self, stages: Mapping[str, HostedStage]) -> None:
        """Deliver what arrives for these stages (they run in this process) to them."""
        self._stages.update(stages)

    def on_submit_failure(self, fail: Callable[[str, str], None]) -> None:
        """In the main process: ``fail(request_id, error)`` fails a request whose inputs were not delivered."""
        self._fail_submitted = fail

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind the receive socket and handle messages until :meth:`stop`; close everything after.

        Shielded from outside cancellation: while a pipeline shuts down (after
        Ctrl-C, a caller's cancel scope, a dead worker) its aborts and
        Shutdown messages still need the endpoint.
        """
        inbox = self._peers.open_inbox()
        try:
            with self._serving:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._dispatcher.receive_loop, inbox, inbox.source)
                    if self.process != "main":
                        nursery.start_soon(self._reporter.run)
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            await self._close()

    def stop(self) -> None:
        """End :meth:`serve` (its sockets close, outstanding transfers are settled)."""
        self._serving.cancel()

    def _closing(self) -> bool:
        return self._serving.cancel_called

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the endpoint (it ends with the endpoint)."""
        assert self._nursery is not None, "the endpoint is not serving"
        self._nursery.start_soon(fn, *args)

    async def _close(self) -> None:
        # Runs while the endpoint is being cancelled: nothing here may be skipped.
        with trio.CancelScope(shield=True):
            self._transfers.close()
            await self._sender.aclose()
            # Views already handed out keep their mappings; releases are moot
            # now (each sender unlinks its own slots when it closes).
            self._segments.clear()
            self._releases.clear()
            self._peers.close()

    # ------------------------------------------------------------------ sockets

    def listen_tcp(self, endpoint: str) -> str:
        """Receive also at the ``tcp://`` ``endpoint`` (CURVE; peers on other hosts); return where."""
        sock = self._peers.listen_tcp(endpoint)
        self.spawn(self._dispatcher.receive_loop, sock, sock.source)
        return sock.source

    def receive_also(self, endpoint: str, admit: Callable[[], bool]) -> TrioSocket:
        """Receive also on a socket of its own bound at the ``tcp://`` ``endpoint`` (CURVE): its messages
        are handled like the others while ``admit()`` says so; :meth:`release` closes it."""
        sock = self._peers.bind(endpoint)
        self.spawn(self._dispatcher.receive_loop, sock, sock.source, admit)
        return sock

    def learn_address(self, process: str, endpoint: str) -> None:
        """``process`` (one of the run's) is reached over TCP at ``endpoint`` (a new address, after a
        restart, replaces the connection to the old one)."""
        self._peers.learn_address(process, endpoint)

    def release(self, sock: TrioSocket) -> None:
        """Close ``sock`` (one :meth:`adopt` took) now."""
        self._peers.release(sock)

    def adopt(self, sock: TrioSocket) -> None:
        """Close ``sock`` with the endpoint."""
        self._peers.adopt(sock)

    def forget_peer(self, process: str) -> None:
        """``process`` is gone: settle the transfers waiting for its stages' ACKs (none will come; their
        requests fail with it) and give back the credits they held; a process on another host is
        forgotten too (its next incarnation joins at an address of its own)."""
        self._transfers.forget_receivers({a for a, p in self.placement.items() if p == process})
        self._peers.forget(process)

    @property
    def context(self) -> zmq.Context[Any]:
        """The endpoint's ZMQ context (for sockets another component opens beside it: :meth:`adopt`)."""
        return self._peers.context

    @property
    def tcp_endpoint(self) -> str | None:
        """Where this process receives over TCP (None: ipc only)."""
        return self._peers.tcp_endpoint

    @property
    def tcp_addresses(self) -> dict[str, str]:
        """The ``tcp://`` endpoints of the peers known to be on other hosts."""
        return self._peers.tcp_addresses

    @property
    def refused(self) -> int:
        """Messages this process refused (:attr:`Peers.refused <omni_trio.control.peers.Peers.refused>`)."""
        return self._peers.refused

    @property
    def undeliverable(self) -> int:
        """Messages dropped because nobody listened at a same-host peer's path (a dead worker)."""
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

    def _process_of(self, stage: str) -> str:
        """The process ``stage`` (or the coordinator) runs in."""
        return "main" if stage == COORDINATOR else self.placement.get(stage, "main")

    # ------------------------------------------------------------------ the stages here

    async def _fail_request(self, sender: str, request_id: str, error: str) -> None:
        """Fail ``request_id`` on behalf of a stage (or the coordinator) of this process."""
        stage = self._stages.get(sender)
        if stage is not None:
            await stage.send_failure(request_id, error)
        elif sender == COORDINATOR and self._fail_submitted is not None:
            self._fail_submitted(request_id, error)

    def _stage(self, name: str) -> HostedStage:
        stage = self._stages.get(name)
        if stage is None:
            raise LookupError(f"stage {name!r} does not run in process {self.process!r}")
        return stage

    def _request_retired(self, sender: str, request_id: str) -> bool:
        stage = self._stages.get(sender)
        return stage is not None and request_id in stage.aborted

    async def _on_abort(self, message: m.Abort) -> None:
        for stage in self._stages.values():
            stage.abort_requests(message.request_ids)
        if self.process != "main":
            await self._peers.send("main", m.AbortDone(token=message.token, process=self.process))

    def _arrived(self, handler: Callable[[M], Awaitable[None]]) -> Callable[[M], Awaitable[None]]:
        """``handler``, after which the safety net reports what the stages hold (in a while)."""

        async def handle(message: M) -> None:
            self._reporter.want()
            await handler(message)

        return handle

    def stage_idle(self) -> None:
        """A stage here let go of the last request it held: if none holds any, no report is due."""
        if not any(stage.active for stage in self._stages.values()):
            self._reporter.settle()

    def _held(self) -> list[str]:
        return sorted({request_id for stage in self._stages.values() for request_id in stage.active})

    async def _report_held(self, held: list[str]) -> None:
        with contextlib.suppress(trio.ClosedResourceError):  # closing: nothing is held for long now
            await self._peers.send("main", m.HeldReport(process=self.process, request_ids=held))

    async def _on_ack(self, message: m.DataAck) -> None:
        self._transfers.on_ack(message)

    async def _on_credit_return(self, message: m.CreditReturn) -> None:
        self._transfers.on_credit_return(message)
