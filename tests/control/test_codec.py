"""The control-message codec: round trips, validation, and fuzzing of decode."""

from __future__ import annotations

import itertools
import random
import types
import typing
from typing import Any

import attrs
import msgpack
import pytest

from omni_trio.control.wire.codec import OOB_THRESHOLD, MalformedMessage, decode, encode
from omni_trio.control.wire.messages import (
    MESSAGE_TYPES,
    Complete,
    ControlMessage,
    DataAck,
    DataReady,
    PeerAddresses,
    Ready,
    StatsReply,
    message,
)
from tests.field_types import fields_conform

_CANDIDATES: dict[Any, list[Any]] = {
    str: ["p0", ""],
    int: [0, 7],
    bool: [True, False],
    bytes: [b"\x80\x05pickled"],
    float: [1.5],
}


def _candidates(tp: Any) -> list[Any]:
    """Plausible values for a field type (valid ones first)."""
    if tp in _CANDIDATES:
        return _CANDIDATES[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return [v for arg in args if arg is not type(None) for v in _candidates(arg)] + [None]
    if origin is dict or tp is dict:
        return [{"_type": "DataRef", "version": 1}]
    if origin in (list, tuple):
        return [["a", "b"]]
    return [None]


def _auto_samples(cls: type[ControlMessage], limit: int = 4) -> list[ControlMessage]:
    """Valid instances of ``cls`` built from field types, so new messages are covered too."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in attrs.fields(cls)]
    found: list[ControlMessage] = []
    for values in itertools.islice(itertools.product(*(_candidates(hints[n]) for n in names)), 5000):
        try:
            found.append(cls(**dict(zip(names, values, strict=True))))
        except (TypeError, ValueError):
            continue
        if len(found) >= limit:
            break
    return found


# Hand-written variants of the messages SPEC §2.2 pins down, plus generated
# samples of every registered message (whatever the registry holds today).
SAMPLES: list[ControlMessage] = [
    DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref={"_type": "DataRef", "version": 1}),
    DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref={"k": [1, 2.5, None]}, chunk_id=0),
    DataReady(request_id="r0", from_stage="a", to_stage="b", data_ref={}, chunk_id=3, chunk_count=64),
    DataReady(request_id="r0", from_stage="a", to_stage="b", is_done=True),
    DataReady(request_id="r0", from_stage="a", to_stage="b", error="decoder exploded"),
    DataAck(request_id="r0", from_stage="b", to_stage="a", object_id="r0:payload:a:b:1", success=True),
    DataAck(request_id="r0", from_stage="b", to_stage="a", object_id="o", success=False, error="read failed"),
    Ready(process="p0", stages=["a", "b"]),
    Ready(process="p0", stages=["a"], address="tcp://10.0.0.2:4567"),
    PeerAddresses(addresses={"p_far": "tcp://10.0.0.2:4567", "p@r1": "tcp://[::1]:80", "q": "tcp://h.example:1"}),
    PeerAddresses(addresses={}),
    StatsReply(token=7, stages={"a": {"active": 0}}, process="p0"),
]
for _cls in MESSAGE_TYPES.values():
    SAMPLES.extend(_auto_samples(_cls))


def test_samples_cover_every_registered_message() -> None:
    assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: ControlMessage) -> None:
    frames = encode(msg)
    assert frames[0] == type(msg).TAG.encode()
    assert all(type(f) is bytes for f in frames)
    assert decode(frames) == msg
    assert decode([bytearray(frames[0]), memoryview(frames[1])]) == msg


def test_defaults_are_omitted_on_the_wire() -> None:
    frames = encode(DataReady(request_id="r", from_stage="a", to_stage="b", is_done=True))
    assert msgpack.unpackb(frames[1]) == {"request_id": "r", "from_stage": "a", "to_stage": "b", "is_done": True}


def test_large_bytes_travel_out_of_band() -> None:
    big = bytes(range(256)) * (OOB_THRESHOLD // 256 + 1)
    msg = DataReady(request_id="r", from_stage="a", to_stage="b", data_ref={"header": big})
    frames = encode(msg)
    assert len(frames) == 3 and frames[2] is big and len(frames[1]) < 100
    assert decode(frames) == msg
    nested = DataReady(request_id="r", from_stage="a", to_stage="b", data_ref={"header": big, "l": [big]})
    frames = encode(nested)
    assert len(frames) == 4
    assert decode(frames) == nested
    # dangling, reused or unreferenced out-of-band frames are malformed
    with pytest.raises(MalformedMessage, match="out-of-band"):
        decode(frames[:3])
    with pytest.raises(MalformedMessage, match="unreferenced"):
        decode([*frames, b"extra"])


@pytest.mark.parametrize(
    ("tag", "fields", "reason"),
    [
        ("nope", {}, "unknown message type"),
        ("abort", {}, "required field missing"),
        ("abort", {"request_ids": ["r"], "token": 1, "extra": 1}, "extra fields"),
        ("abort", {"request_ids": [""], "token": 1}, "non-empty"),
        ("abort", {"request_ids": [5], "token": 1}, "str"),
        ("data_ready", {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "x": 1}, "extra"),
        ("data_ready", {"request_id": "r", "from_stage": "a", "to_stage": "b"}, "needs a data_ref"),
        ("data_ready", {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": [1]}, "map"),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "is_done": True, "error": "x"},
            "mutually exclusive",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "is_done": True, "chunk_id": 1},
            "neither data_ref nor chunk_id",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "error": "e", "data_ref": {}},
            "neither data_ref nor chunk_id",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "", "data_ref": {}},
            "non-empty",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "chunk_id": -1},
            "chunk_id",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "chunk_id": True},
            "chunk_id",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "chunk_id": 0, "chunk_count": 0},
            "chunk_count",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "chunk_id": 0, "chunk_count": 65},
            "chunk_count",
        ),
        (
            "data_ready",
            {"request_id": "r", "from_stage": "a", "to_stage": "b", "data_ref": {}, "chunk_count": 2},
            "chunk_count is for stream chunks",
        ),
        (
            "stream",
            {"request_id": "r", "from_stage": "a", "chunk_id": 0, "data_ref": {}, "chunk_count": 1.0},
            "chunk_count",
        ),
        ("stream", {"request_id": "r", "from_stage": "a", "chunk_id": None, "data_ref": {}}, "chunk_id"),
        (
            "data_ack",
            {"request_id": "r", "from_stage": "b", "to_stage": "a", "object_id": "o", "success": False},
            "needs an error",
        ),
        (
            "data_ack",
            {"request_id": "r", "from_stage": "b", "to_stage": "a", "object_id": "o", "success": 1},
            "bool",
        ),
        ("ready", {"process": "p", "stages": "ab"}, "tuple"),
        ("ready", {"process": "p", "stages": [], "address": "ipc:///tmp/x"}, "tcp://HOST:PORT"),
        ("peer_addresses", {"addresses": {"p": "tcp://10.0.0.2:*"}}, "tcp://HOST:PORT"),
        ("peer_addresses", {"addresses": {"../x": "tcp://10.0.0.2:1"}}, "process names"),
        ("peer_addresses", {"addresses": {"p": 7}}, "tcp://HOST:PORT"),
        ("peer_addresses", {"addresses": ["p"]}, "map"),
        ("stats_request", {"reply_to": "x", "token": "7"}, "int"),
    ],
)
def test_invalid_messages_are_malformed(tag: str, fields: dict[str, Any], reason: str) -> None:
    with pytest.raises(MalformedMessage) as info:
        decode([tag.encode(), msgpack.packb(fields)])
    assert reason in info.value.reason


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"abort"],
        "abort",
        [b"abort", b"\x81\xaarequest_id"],  # truncated
        [b"abort", msgpack.packb([1, 2])],  # not a map
        [b"abort", msgpack.packb({1: "r"})],  # non-string key
        [b"abort", msgpack.packb({"request_id": "r"}) + b"\x00"],  # trailing bytes
        [b"abort", msgpack.packb({"request_id": msgpack.ExtType(5, b"x")})],  # foreign extension
        [b"\xff\xfe", msgpack.packb({})],  # non-ASCII tag
        [b"abort", 12],  # not bytes
        [b"abort", b"\xa2\xff\xfe"],  # invalid UTF-8 string
    ],
)
def test_broken_frames_are_malformed(frames: Any) -> None:
    with pytest.raises(MalformedMessage):
        decode(frames)


def test_constructors_validate_at_the_sender() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataReady(request_id="r", from_stage="a", to_stage="b", is_done=True, error="x")
    with pytest.raises(ValueError):
        DataAck(request_id="r", from_stage="b", to_stage="a", object_id="o", success=True, error="x")
    with pytest.raises(ValueError):
        Complete(request_id="r", from_stage="z", success=False)
    with pytest.raises(TypeError):
        Ready(process="p", stages="ab")


def test_encode_refuses_unregistered_or_unencodable() -> None:
    @attrs.frozen
    class Unregistered(ControlMessage):
        x: int = 0

    with pytest.raises(TypeError, match="not a registered"):
        encode(Unregistered())
    with pytest.raises(TypeError, match="cannot encode"):
        encode(StatsReply(token=1, stages={"a": object()}))


def test_registry_rejects_duplicate_tags() -> None:
    with pytest.raises(ValueError, match="already used"):

        @message("abort")
        @attrs.frozen
        class AnotherAbort(ControlMessage):
            request_id: str = ""


# ---------------------------------------------------------------- fuzzing

WEIRD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    1.5,
    "",
    "x",
    b"",
    b"\x00",
    [],
    ["a"],
    {},
    {"a": 1},
    {1: 2},
    [[[]]],
    msgpack.ExtType(1, b"\x00\x00\x00\x09"),
]


def _decode_only_malformed(frames: Any) -> ControlMessage | None:
    try:
        return decode(frames)
    except MalformedMessage:
        return None


def test_fuzz_random_bytes() -> None:
    rng = random.Random(20240601)
    tags = [t.encode() for t in MESSAGE_TYPES] + [b"", b"x"]
    for _ in range(2000):
        body = rng.randbytes(rng.randrange(0, 64))
        extra = [rng.randbytes(rng.randrange(0, 8)) for _ in range(rng.randrange(0, 3))]
        tag = rng.choice(tags) if rng.random() < 0.8 else rng.randbytes(rng.randrange(0, 12))
        _decode_only_malformed([tag, body, *extra])


def test_fuzz_truncated_and_bit_flipped_valid_frames() -> None:
    rng = random.Random(7)
    count = 0
    while count < 2000:
        frames = encode(rng.choice(SAMPLES))
        body = frames[1]
        cut = rng.randrange(0, len(body) + 1)
        _decode_only_malformed([frames[0], body[:cut], *frames[2:]])
        flipped = bytearray(body)
        if flipped:
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        _decode_only_malformed([frames[0], bytes(flipped), *frames[2:]])
        count += 2


def test_fuzz_mistyped_missing_and_extra_fields() -> None:
    rng = random.Random(99)
    count = 0
    while count < 2000:
        msg = rng.choice(SAMPLES)
        frames = encode(msg)
        fields = msgpack.unpackb(frames[1])
        names = [a.name for a in attrs.fields(type(msg))]
        action = rng.random()
        if action < 0.6 and names:
            fields[rng.choice(names)] = rng.choice(WEIRD_VALUES)
        elif action < 0.8 and fields:
            del fields[rng.choice(list(fields))]
        else:
            fields[rng.choice(["extra", "type", "_type", *names])] = rng.choice(WEIRD_VALUES)
        decoded = _decode_only_malformed([frames[0], msgpack.packb(fields, use_bin_type=True)])
        if decoded is not None:  # whatever passed is a valid message of the right type
            assert type(decoded) is type(msg)
            assert decode(encode(decoded)) == decoded
            assert fields_conform(decoded) == []
        count += 1
