"""DataRef wire form: round trips through the codec and strict validation."""

from __future__ import annotations

import contextlib
import copy
import pickle
import random
from typing import Any

import pytest
import torch
import trio

from omni_trio.comm.dataref import BufferRef, DataRef, DataRefKind, Layout, TransportKind, converter, shm_buffer
from omni_trio.comm.oneshot import read_segment
from omni_trio.comm.packing import pack_tensors, unpack_tensors, write_packed
from omni_trio.comm.shm import ShmRelay
from omni_trio.comm.tensor_walk import extract_tensors, restore
from omni_trio.control.wire.codec import MalformedMessage, decode, encode
from omni_trio.control.wire.messages import DataReady
from tests.comm.helpers import copy_out


def _payload_ref() -> DataRef:
    _, tensors = extract_tensors({"a": torch.ones(3), "b": torch.zeros(2, 2, dtype=torch.int64)})
    total, entries = pack_tensors(tensors)
    return DataRef(
        kind=DataRefKind.stage_payload,
        object_id="r0:payload:a:b:1",
        transport=TransportKind.shm,
        layout=Layout.packed_tensors,
        buffer=BufferRef(transport=TransportKind.shm, info={"shm_name": "omnitrio-x-1-0", "size": total}, length=total),
        header=b"\x80\x05header",
        tensors=entries,
    )


def _chunk_ref() -> DataRef:
    _, tensors = extract_tensors(torch.ones(4, 4))
    total, entries = pack_tensors(tensors)
    return DataRef(
        kind=DataRefKind.stream_chunk,
        object_id="r0:stream:a:b:0:0",
        transport=TransportKind.shm,
        layout=Layout.packed_tensors,
        buffer=BufferRef(transport=TransportKind.shm, info={"shm_name": "seg-1", "size": total}, length=total),
        header=b"\x80\x05chunk",
        tensors=entries,
        metadata={"sr": 24000, "final": False},
    )


def _inline_ref() -> DataRef:
    return DataRef(
        kind=DataRefKind.stage_payload,
        object_id="r0:payload:a:b:2",
        transport=TransportKind.inline,
        layout=Layout.packed_tensors,
        header=b"tensor-free",
    )


@pytest.mark.parametrize("ref", [_payload_ref(), _chunk_ref(), _inline_ref()], ids=["payload", "chunk", "inline"])
def test_round_trip_through_the_codec(ref: DataRef) -> None:
    wire = ref.to_wire()
    assert wire["_type"] == "DataRef" and wire["version"] == 1
    assert type(wire["kind"]) is str and type(wire["transport"]) is str  # plain msgpack types
    assert DataRef.from_wire(wire) == ref
    msg = DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref=wire)
    decoded = decode(encode(msg))
    assert isinstance(decoded, DataReady) and decoded.data_ref is not None
    assert DataRef.from_wire(decoded.data_ref) == ref


@pytest.mark.parametrize(
    ("header", "metadata"), [(b"tensor-free", None), (None, None), (b"h", {"sr": 24000}), (None, {"final": True})]
)
def test_an_inline_refs_map_is_the_converters_map(header: bytes | None, metadata: dict[str, Any] | None) -> None:
    """to_wire builds an inline ref's map by hand: the converter's map, key for key and in its order."""
    ref = DataRef(kind=DataRefKind.stream_chunk, object_id="r0:c", transport=TransportKind.inline,
                  layout=Layout.packed_tensors, header=header, metadata=metadata, tensor_bytes=64)
    wire = ref.to_wire()
    assert list(wire.items()) == list({**converter.unstructure(ref), "_type": "DataRef"}.items())
    assert all(type(wire[key]) is str for key in ("kind", "transport", "layout"))
    assert DataRef.from_wire(wire) == ref


def test_an_inline_ref_names_every_unknown_or_mistyped_enum_field() -> None:
    wire = {**_inline_ref().to_wire(), "kind": "bogus", "transport": 3, "layout": "sideways"}
    with pytest.raises(MalformedMessage) as info:
        DataRef.from_wire(wire)
    assert info.value.reason == (
        "malformed DataRef: 'bogus' is not a valid DataRefKind; transport must be a string, got int; "
        "'sideways' is not a valid Layout"
    )


def _mutations() -> list[tuple[str, Any]]:
    return [
        ("_type", "TorchCudaIpcPayload"),
        ("version", 2),
        ("version", True),
        ("kind", "bogus"),
        ("transport", "carrier_pigeon"),
        ("layout", 3),
        ("object_id", ""),
        ("header", "not bytes"),
        ("extra", 1),
        ("tensors", "t0"),
    ]


@pytest.mark.parametrize(("key", "value"), _mutations())
def test_bad_fields_are_malformed(key: str, value: Any) -> None:
    wire = _payload_ref().to_wire()
    wire[key] = value
    with pytest.raises(MalformedMessage):
        DataRef.from_wire(wire)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("offset", 1, "aligned"),
        ("offset", 10_000, "exceeds"),
        ("size", 4, "does not match"),
        ("dtype", "torch.uint16", "unsupported dtype"),
        ("shape", [-1], "shape"),
        ("path", "t1", "duplicate"),
    ],
)
def test_inconsistent_tensor_entries_are_malformed(field: str, value: Any, reason: str) -> None:
    wire = _payload_ref().to_wire()
    wire["tensors"] = [dict(e) for e in wire["tensors"]]
    wire["tensors"][0][field] = value
    with pytest.raises(MalformedMessage, match=reason):
        DataRef.from_wire(wire)


def test_other_layout_rules() -> None:
    wire = _payload_ref().to_wire()
    del wire["version"]
    with pytest.raises(MalformedMessage, match="version"):
        DataRef.from_wire(wire)
    wire = _payload_ref().to_wire()
    wire["buffer"] = dict(wire["buffer"], info={"shm_name": "s", "size": 1})
    with pytest.raises(MalformedMessage, match="size"):
        DataRef.from_wire(wire)
    wire = _payload_ref().to_wire()
    del wire["buffer"]
    with pytest.raises(MalformedMessage, match="no buffer"):
        DataRef.from_wire(wire)
    bad: Any
    for bad in (None, [], "DataRef", 3):
        with pytest.raises(MalformedMessage):
            DataRef.from_wire(bad)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transport", "local_object"),  # a same-process hand-over never travels as a DataRef
        ("transport", "local_copy"),
        ("transport", "cuda_ipc"),  # no such transport: refused, not accepted and dropped later
        ("kind", "kv_pages"),
        ("layout", "raw_tensor"),
    ],
)
@pytest.mark.parametrize("ref", [_payload_ref, _inline_ref], ids=["payload", "inline"])
def test_what_no_sender_writes_is_refused(ref: Any, key: str, value: str) -> None:
    wire = ref().to_wire()
    wire[key] = value
    with pytest.raises(MalformedMessage):
        DataRef.from_wire(wire)


def test_fuzz_from_wire_raises_only_malformed() -> None:
    rng = random.Random(5)
    values: list[Any] = [None, 0, -3, 1.5, "", "x", b"", [], [1], {}, {"a": 1}, True, "torch.float32", 2**40]
    base = _payload_ref().to_wire()
    for _ in range(2000):
        wire = copy.deepcopy(base)
        target: dict[str, Any] = wire
        roll = rng.random()
        if roll < 0.3:
            target = wire["buffer"]
        elif roll < 0.6:
            target = rng.choice(wire["tensors"])
        key = rng.choice([*target, "zzz"])
        if rng.random() < 0.2:
            target.pop(key, None)
        else:
            target[key] = rng.choice(values)
        with contextlib.suppress(MalformedMessage):
            DataRef.from_wire(wire)


async def test_shm_payload_end_to_end(shm_prefix: str) -> None:
    """Sender packs into shm, DataReady crosses the codec, receiver reads and restores."""
    with trio.fail_after(10):
        payload = {"pcm": torch.randn(16_000), "ids": torch.arange(10), "text": "hi"}
        header_obj, tensors = extract_tensors(payload)
        total, entries = pack_tensors(tensors)
        relay = ShmRelay(shm_prefix)
        put = await relay.put("b", total, lambda view: write_packed(view, tensors, entries))
        ref = DataRef(
            kind=DataRefKind.stage_payload,
            object_id="r0:payload:a:b:0",
            transport=TransportKind.shm,
            layout=Layout.packed_tensors,
            buffer=shm_buffer(put),
            header=pickle.dumps(header_obj),
            tensors=entries,
        )
        frames = encode(DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref=ref.to_wire()))

        msg = decode(frames)
        assert isinstance(msg, DataReady) and msg.data_ref is not None
        got = DataRef.from_wire(msg.data_ref)
        assert got.buffer is not None and got.header is not None

        raw = await read_segment(got.buffer.info["shm_name"], got.buffer.length, copy_out, prefix=shm_prefix)
        back = restore(pickle.loads(got.header), unpack_tensors(raw, got.tensors))
        relay.settle(put, True)
        assert isinstance(back, dict) and back["text"] == "hi"
        assert torch.equal(back["pcm"], tensors["t0"]) and torch.equal(back["ids"], tensors["t1"])
