"""Tensors to another host (omni_trio/comm/tcp.py, bulk.py): the DataRef names an offer, the receiver
fetches it on a sealed bulk connection into its tensors' buffer; what does not open with the run's key
is refused, counted and dropped; credits bound the transfers in flight. Loopback TCP here; across
network namespaces in tests/process/test_cross_host.py and tests/comm/test_bulk_netns.py."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
from collections.abc import AsyncIterator

import pytest
import torch
import trio
import trio.testing

from omni_trio.comm.bulk import BulkFetcher, BulkRefused, BulkServer, TransferGone
from omni_trio.comm.bulk_seal import CHUNK, NONCE_BYTES
from omni_trio.comm.dataref import BufferRef, DataRef, DataRefKind, Layout, TransportKind
from omni_trio.comm.layout import TensorEntry
from omni_trio.comm.packing import pack_tensors
from omni_trio.comm.shm import ShmRelay
from omni_trio.comm.tcp import TcpCredits, tensor_frame
from omni_trio.comm.transfer import decode_object, encode_object
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import new_secret
from omni_trio.control.wire.codec import MalformedMessage, decode, encode
from omni_trio.payload import OmniRequest, StagePayload

SECRET = new_secret()


@pytest.fixture
async def server() -> AsyncIterator[BulkServer]:
    bulk = BulkServer(SECRET, proof_timeout_s=0.5)
    bulk.bind("127.0.0.1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bulk.serve)
        yield bulk
        nursery.cancel_scope.cancel()


def _entries(tensors: dict[str, torch.Tensor]) -> tuple[int, tuple[TensorEntry, ...]]:
    total, entries = pack_tensors(tensors)
    return total, tuple(entries)


async def test_a_tensor_crosses_as_a_fetch_into_one_new_buffer(server: BulkServer) -> None:
    big = torch.arange(3 * CHUNK // 4 + 5, dtype=torch.float32)  # 3 MiB and a bit: several records, a short last
    payload = StagePayload("r0", OmniRequest("x"), {"t": big, "small": torch.ones(3, dtype=torch.int64), "n": 7})
    relay = ShmRelay("ot-test-tcp-unused", credits_per_target=2)
    credits = TcpCredits(2, server)
    fetcher = BulkFetcher(SECRET)
    try:
        with trio.fail_after(20):
            ref, put = await encode_object(
                payload, relay=relay, sender="a", target="b", object_id="o1", kind=DataRefKind.stage_payload,
                tcp=credits,
            )
            assert ref.transport is TransportKind.tcp and put is not None and credits.in_use("b") == 1
            frames = encode(m.DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref=ref.to_wire()))
            # No tensor byte rides the control message: it names the offer only.
            assert sum(len(bytes(f)) for f in frames) < 4096 and server.offered == 1
            message = decode([bytes(f) for f in frames])
            assert isinstance(message, m.DataReady) and message.data_ref is not None
            received = DataRef.from_wire(message.data_ref)
            got = await decode_object(received, bulk=fetcher)
            again = await decode_object(received, bulk=fetcher)  # the idle connection serves the next fetch
    finally:
        await relay.aclose()
        fetcher.close()
    assert torch.equal(got.data["t"], big) and torch.equal(got.data["small"], torch.ones(3, dtype=torch.int64))
    assert got.data["n"] == 7 and got.request.inputs == "x" and torch.equal(again.data["t"], big)
    # Both tensors are views of one buffer the fetch filled (no copy after the records opened).
    storage = got.data["t"].untyped_storage().data_ptr()
    assert got.data["small"].untyped_storage().data_ptr() == storage
    assert fetcher.refused == 0 and server.refused == 0 and fetcher.idle == 0
    assert put is not None
    credits.settle(put, True)  # the ACK: the offer is withdrawn, the credit comes back
    assert server.offered == 0 and credits.in_use("b") == 0


async def test_a_settled_transfer_is_gone_and_the_connection_serves_on(server: BulkServer) -> None:
    tensor = torch.arange(100, dtype=torch.int64)
    total, entries = _entries({"t": tensor})
    transfer = server.offer([tensor_frame(tensor)])
    fetcher = BulkFetcher(SECRET)
    try:
        with trio.fail_after(10):
            server.withdraw(transfer)
            with pytest.raises(TransferGone):
                await fetcher.fetch(server.address, transfer, entries, total)  # type: ignore[arg-type]
            transfer = server.offer([tensor_frame(tensor)])
            buffer = await fetcher.fetch(server.address, transfer, entries, total)  # type: ignore[arg-type]
    finally:
        fetcher.close()
    assert torch.equal(buffer.view(torch.int64), tensor)


async def test_with_no_descriptor_free_waiting_connections_are_refused_and_the_listener_serves_on(
    server: BulkServer,
) -> None:
    """The process is out of descriptors (its limit lowered, the rest taken): the listener refuses what
    waits with the descriptor it keeps in reserve, instead of failing or spinning; then it serves on."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    clients = [socket.socket() for _ in range(2)]  # made while descriptors are free
    fillers: list[int] = []
    try:
        with trio.fail_after(10):
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
            with contextlib.suppress(OSError):
                while True:
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            for client in clients:
                client.setblocking(False)
                client.connect_ex(server.address)  # type: ignore[arg-type]
            while server.refused < len(clients):  # the listener's task, on this loop (bounded by fail_after)
                await trio.sleep(0.01)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for client in clients:
            client.close()
    assert server.refused == len(clients)
    tensor = torch.arange(100, dtype=torch.int64)
    total, entries = _entries({"t": tensor})
    fetcher = BulkFetcher(SECRET)
    try:
        with trio.fail_after(10):
            transfer = server.offer([tensor_frame(tensor)])
            buffer = await fetcher.fetch(server.address, transfer, entries, total)  # type: ignore[arg-type]
    finally:
        fetcher.close()
    assert torch.equal(buffer.view(torch.int64), tensor)


async def test_a_connection_without_the_runs_key_is_refused_and_the_listener_serves_on(server: BulkServer) -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    total, entries = _entries({"t": tensor})
    transfer = server.offer([tensor_frame(tensor)])
    assert server.address is not None
    with trio.fail_after(10):
        # Another run's secret: its first request does not open; the connection is closed.
        with pytest.raises((ConnectionError, OSError)):
            await BulkFetcher(new_secret()).fetch(server.address, transfer, entries, total)
        # Garbage after the handshake's nonce, and a connection that sends nothing (the proof timeout).
        for sent in (b"n" * NONCE_BYTES + b"x" * 40, b""):
            raw = trio.socket.socket()
            with raw:
                await raw.connect(server.address)
                await raw.send(sent) if sent else None
                nonce = await raw.recv(NONCE_BYTES)
                assert len(nonce) == NONCE_BYTES
                assert await raw.recv(100) == b""  # closed, nothing of the offer sent
        assert server.refused == 3
        fetcher = BulkFetcher(SECRET)
        try:
            buffer = await fetcher.fetch(server.address, transfer, entries, total)
        finally:
            fetcher.close()
    assert torch.equal(buffer.view(torch.float32), tensor)


async def test_a_tampered_record_fails_its_fetch_is_counted_and_its_connection_closed() -> None:
    """A man in the middle flips one byte of a data record: the fetch is refused, nothing is handed over."""
    bulk = BulkServer(SECRET)
    bulk.bind("127.0.0.1")
    tensor = torch.arange(CHUNK // 2, dtype=torch.float32)  # 2 MiB: two records
    total, entries = _entries({"t": tensor})
    transfer = bulk.offer([tensor_frame(tensor)])
    assert bulk.address is not None
    relay = socket.create_server(("127.0.0.1", 0))
    flipped: list[int] = []

    async def forward(source: trio.socket.SocketType, sink: trio.socket.SocketType, tamper: bool) -> None:
        with contextlib.suppress(OSError):  # the fetcher closes its end on the refusal
            await forward_until_closed(source, sink, tamper)

    async def forward_until_closed(source: trio.socket.SocketType, sink: trio.socket.SocketType, tamper: bool) -> None:
        seen = 0
        while data := await source.recv(65536):
            if tamper and not flipped and seen + len(data) > NONCE_BYTES + 17 + 1000:
                at = NONCE_BYTES + 17 + 1000 - seen  # a byte of the first data record
                data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]
                flipped.append(at)
            seen += len(data)
            await sink.send(data)

    async def middle(task_status: trio.TaskStatus[None]) -> None:
        listener = trio.socket.from_stdlib_socket(relay)
        task_status.started()
        client, _ = await listener.accept()
        upstream = trio.socket.socket()
        await upstream.connect(bulk.address)
        with client, upstream:
            async with trio.open_nursery() as inner:
                inner.start_soon(forward, upstream, client, True)
                inner.start_soon(forward, client, upstream, False)

    fetcher = BulkFetcher(SECRET)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bulk.serve)
            await nursery.start(middle)
            with pytest.raises(BulkRefused):
                await fetcher.fetch(("127.0.0.1", relay.getsockname()[1]), transfer, entries, total)
            assert flipped and fetcher.refused == 1 and fetcher.idle == 0  # its connection closed
            # The process serves on: a direct fetch of the same offer goes through.
            buffer = await fetcher.fetch(bulk.address, transfer, entries, total)
            assert torch.equal(buffer.view(torch.float32), tensor)
            fetcher.close()
            nursery.cancel_scope.cancel()
    relay.close()
    # The listener closed with its serve: nothing answers at its port any more.
    with pytest.raises(OSError):
        socket.create_connection(bulk.address, timeout=5).close()


def test_a_tcp_ref_names_a_listener_and_a_transfer() -> None:
    good = DataRef(
        kind=DataRefKind.stage_payload, object_id="o", transport=TransportKind.tcp, layout=Layout.packed_tensors,
        buffer=BufferRef(transport=TransportKind.tcp, info={"host": "10.0.0.1", "port": 5000, "transfer": "ab" * 16},
                         length=4),
        header=b"h", tensors=[TensorEntry("t", (1,), "torch.float32", "cpu", 0, 4)],
    )
    wire = good.to_wire()
    assert DataRef.from_wire(wire) == good
    for info in ({}, {"host": "h", "port": 0, "transfer": "ab" * 16}, {"host": "h", "port": 1, "transfer": "zz"}):
        with pytest.raises(MalformedMessage, match="tcp buffer"):
            DataRef.from_wire({**wire, "buffer": {**wire["buffer"], "info": info}})


async def test_credits_bound_the_transfers_in_flight_to_each_target(server: BulkServer) -> None:
    credits = TcpCredits(2, server)
    frame = [memoryview(b"x" * 10)]
    first, second = await credits.put("b", frame), await credits.put("b", frame)
    await credits.put("c", frame)  # another target has its own
    third: list[object] = []

    async def put_third() -> None:
        third.append(await credits.put("b", frame))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put_third)
        await trio.testing.wait_all_tasks_blocked()
        assert third == [] and credits.in_use("b") == 2
        credits.settle(first, True, keep_credit=True)  # the receiver holds it until its scheduler takes it
        await trio.testing.wait_all_tasks_blocked()
        assert third == []
        credits.return_credit("b")
    assert len(third) == 1 and credits.in_use("b") == 2
    credits.settle(second, False)
    assert credits.in_use("b") == 1 and server.offered == 2  # "c"'s and the third's
