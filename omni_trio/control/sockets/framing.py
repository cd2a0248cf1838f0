"""The same-host link's wire format: how a message's frames are laid out in a Unix stream.

Per message: ``<II`` (frame count, 0) then one ``<I`` length per frame, then the frames. A message's
frames together, its proof included, may hold the policy's ``max_message_bytes``. A stream that
breaks the format (more than :data:`MAX_FRAMES` frames, more bytes than that, a reserved field set)
is refused before any of its frame bytes are kept.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from omni_trio.control.wire.auth import Frame

__all__ = ["MAX_FRAMES", "frame_view", "message_head", "split_messages"]

#: Most frames one message may have (a peer sending more is disconnected).
MAX_FRAMES = 4096
_HEAD = struct.Struct("<II")
_LENGTH = struct.Struct("<I")


def message_head(sizes: Sequence[int]) -> bytes:
    """What precedes a message of frames of these ``sizes`` on the wire (see the module docstring)."""
    return _HEAD.pack(len(sizes), 0) + struct.pack(f"<{len(sizes)}I", *sizes)


def frame_view(frame: Frame) -> memoryview:
    """The bytes of ``frame`` as a flat memoryview."""
    return memoryview(frame.buffer if not isinstance(frame, bytes | bytearray | memoryview) else frame).cast("B")


def split_messages(buffer: bytearray, max_bytes: int, whole: list[list[bytes]]) -> str | None:
    """Move the whole messages at the start of ``buffer`` to ``whole``; why the stream is refused, if it is
    (then ``buffer`` is left as it was after the last whole message)."""
    at = 0
    end = len(buffer)
    view = memoryview(buffer)
    try:
        while end - at >= _HEAD.size:
            count, reserved = _HEAD.unpack_from(buffer, at)
            if count > MAX_FRAMES or reserved:
                return f"a message of {count} frames (at most {MAX_FRAMES})" if count > MAX_FRAMES else "bad header"
            lengths_at = at + _HEAD.size
            if end - lengths_at < count * _LENGTH.size:
                break
            lengths = struct.unpack_from(f"<{count}I", buffer, lengths_at)
            size = sum(lengths)
            if size > max_bytes:
                return f"a message of {size} bytes (at most {max_bytes})"
            frame_at = lengths_at + count * _LENGTH.size
            if end - frame_at < size:
                break
            frames = []
            for length in lengths:
                frames.append(bytes(view[frame_at : frame_at + length]))
                frame_at += length
            whole.append(frames)
            at = frame_at
    finally:
        view.release()
        del buffer[:at]
    return None
