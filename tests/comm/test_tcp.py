"""Tensors to another host (omni_trio/comm/tcp.py): zero-copy frames out, tensors over the received
frames in, validated DataRefs, and credits that bound the transfers in flight."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trio
import trio.testing

from omni_trio.comm.dataref import BufferRef, DataRef, DataRefKind, Layout, TransportKind
from omni_trio.comm.layout import TensorEntry
from omni_trio.comm.shm import ShmRelay
from omni_trio.comm.tcp import TcpCredits
from omni_trio.comm.transfer import decode_object, encode_object
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import MalformedMessage, decode, encode
from omni_trio.payload import OmniRequest, StagePayload


def _address(buffer: object) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)  # type: ignore[call-overload]


async def test_tensors_travel_as_their_own_frames_without_copies() -> None:
    big = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB
    payload = StagePayload("r0", OmniRequest("x"), {"t": big, "small": torch.ones(3, dtype=torch.int64), "n": 7})
    relay = ShmRelay("ot-test-tcp-unused", credits_per_target=2)
    credits = TcpCredits(2)
    try:
        ref, put = await encode_object(
            payload, relay=relay, sender="a", target="b", object_id="o1", kind=DataRefKind.stage_payload, tcp=credits
        )
    finally:
        await relay.aclose()
    assert ref.transport is TransportKind.tcp and put is not None and credits.in_use("b") == 1
    frames = encode(m.DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref=ref.to_wire()))
    # The 1 MiB tensor is a frame of the message, a view of the tensor's own storage.
    (view,) = [f for f in frames if isinstance(f, memoryview)]
    assert _address(view) == big.data_ptr() and view.nbytes == big.numel() * 4
    received = [bytes(f) for f in frames]  # what a socket hands over
    message = decode(received)
    assert isinstance(message, m.DataReady) and message.data_ref is not None
    got = await decode_object(DataRef.from_wire(message.data_ref))
    assert torch.equal(got.data["t"], big) and torch.equal(got.data["small"], torch.ones(3, dtype=torch.int64))
    assert got.data["n"] == 7 and got.request.inputs == "x"
    # The received tensor is built over the frame it arrived in: no second copy.
    frame = next(f for f in received if len(f) == view.nbytes)
    assert got.data["t"].data_ptr() == _address(frame)


@pytest.mark.parametrize("frames", [(b"\0" * 8,), (b"\0" * 4, b"\0" * 4), ()])
def test_a_tcp_ref_needs_one_frame_of_the_right_size_per_tensor(frames: tuple[bytes, ...]) -> None:
    good = DataRef(
        kind=DataRefKind.stage_payload, object_id="o", transport=TransportKind.tcp, layout=Layout.packed_tensors,
        buffer=BufferRef(transport=TransportKind.tcp, info={}, length=4), header=b"h",
        tensors=[TensorEntry("t", (1,), "torch.float32", "cpu", 0, 4)],
        frames=(b"\0" * 4,),
    )
    wire = good.to_wire()
    assert DataRef.from_wire(wire).frames == (b"\0" * 4,)
    with pytest.raises(MalformedMessage, match="frame"):
        DataRef.from_wire({**wire, "frames": list(frames)})


def test_frames_without_a_tcp_buffer_are_refused() -> None:
    with pytest.raises(ValueError, match="frames go with a tcp buffer"):
        DataRef(
            kind=DataRefKind.stage_payload, object_id="o", transport=TransportKind.inline,
            layout=Layout.packed_tensors, header=b"h", frames=(b"x",),
        )


async def test_credits_bound_the_transfers_in_flight_to_each_target() -> None:
    credits = TcpCredits(2)
    first, second = await credits.put("b", 10), await credits.put("b", 10)
    await credits.put("c", 10)  # another target has its own
    third: list[object] = []

    async def put_third() -> None:
        third.append(await credits.put("b", 10))

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
    assert credits.in_use("b") == 1
