"""The run's proof (omni_trio/control/wire/auth.py): what it covers, what it refuses, what it reports."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from omni_trio.control.wire.auth import MAC_BYTES, FrameMac, new_secret
from omni_trio.tracing.trace import Tracer, read_trace


def test_a_sealed_message_opens_whatever_buffer_type_it_was_sent_as() -> None:
    auth = FrameMac(new_secret())
    frames = [b"tag", b"body" * 100, b""]
    for as_sent in (frames, [bytearray(f) for f in frames], [memoryview(f) for f in frames],
                    [zmq.Frame(f) for f in frames]):
        sealed = auth.seal(as_sent)
        assert len(sealed) == len(frames) + 1 and len(sealed[-1]) == MAC_BYTES
        received = [bytes(f) if not isinstance(f, zmq.Frame) else f.bytes for f in sealed]
        assert auth.open(received, "test") == frames
    assert auth.refused == 0


def test_every_change_is_refused_and_counted() -> None:
    auth, other = FrameMac(new_secret()), FrameMac(new_secret())
    sealed = [bytes(f) for f in auth.seal([b"ab", b"cd"])]
    mac = sealed[-1]
    bad = [
        [b"ab", b"cd"],
        [b"ab", b"cd", mac[:-1]],
        [b"ab", b"ce", mac],
        [b"abc", b"d", mac],
        [b"ab", b"cd", b"", mac],
        [b"cd", b"ab", mac],
        [bytes(f) for f in other.seal([b"ab", b"cd"])],
        [mac],
        [],
    ]
    for frames in bad:
        assert auth.open(frames, "test") is None
    assert auth.refused == len(bad)
    assert auth.open(sealed, "test") == [b"ab", b"cd"]


def test_a_secret_is_32_bytes() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        FrameMac(b"short")
    assert new_secret() != new_secret()


def test_each_refusal_is_traced_with_the_running_count(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    tracer = Tracer(path, "main")
    auth = FrameMac(new_secret(), process="main", tracer=tracer)
    for _ in range(5):
        auth.open([b"x", b"y"], "/run/main.sock")
    tracer.close()
    events = [e for e in read_trace(path) if e["event"] == "frame_refused"]
    assert [e["refused"] for e in events] == [1, 2, 3, 4, 5]
    assert events[0]["socket"] == "/run/main.sock" and events[0]["process"] == "main"


def test_every_frame_is_hashed_memoryviews_included() -> None:
    auth = FrameMac(new_secret())
    sealed = auth.seal([b"tag", memoryview(b"t" * 100)])
    assert len(sealed[-1]) == MAC_BYTES
    assert auth.open([b"tag", b"t" * 100, bytes(sealed[-1])], "test") == [b"tag", b"t" * 100]
    assert auth.open([b"tag", b"u" * 100, bytes(sealed[-1])], "test") is None
    # A proof with anything after the MAC is no proof.
    assert auth.open([b"tag", b"t" * 100, bytes(sealed[-1]) + (1).to_bytes(4, "little")], "test") is None


def test_forged_messages_of_many_shapes_do_not_grow_the_header_cache() -> None:
    # A message's frame count is the peer's choice and is read before its proof is checked.
    from omni_trio.control.wire.auth import _header

    mac = FrameMac(new_secret())
    for frames in range(2, 300):
        assert mac.open([b"x"] * (frames - 1) + [b"p" * MAC_BYTES], "peer") is None
    assert mac.refused == 298
    assert _header.cache_info().currsize <= 64
