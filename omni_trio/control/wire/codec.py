"""The one codec for control-plane messages.

Wire format (zmq multipart):

* frame 0: the message's type tag, ASCII (``b"data_ready"``);
* frame 1: msgpack map of the message's fields (fields equal to their
  default omitted, bytes as msgpack ``bin``);
* frames 2...: out-of-band ``bytes`` values of 64 KiB and more (pickled
  headers). In the map such a value is the msgpack extension
  ``ExtType(OOB_EXT, <frame index, 4 bytes big-endian>)``. This spares
  msgpack a copy of big payload headers on both sides and lets pyzmq send
  them without copying.

:func:`decode` is the trust boundary of the control plane: it raises
:class:`MalformedMessage` for *any* bad input (unknown tag, broken msgpack,
missing, extra or mistyped fields, violated invariants) and nothing else,
and it never unpickles. The field checks are strict: no ``"1"`` for an int,
no ``True`` for an int, no string for a list.

Messages are flat: each field is a str, int, bool, float, bytes, None, a
list of those or a map. So the codec needs no general (un)structuring: a
table built once per message class lists its fields and their defaults, the
encoder reads the attributes, and the decoder checks the keys and calls the
class, whose validators (:mod:`omni_trio.control.wire.messages`) check every field
strictly; the cost is a few microseconds per message. (A DataRef's map nests, and
:mod:`omni_trio.comm.dataref` structures it with cattrs: :mod:`omni_trio.comm.strict`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgpack

from omni_trio.control.wire.messages import MESSAGE_TYPES, ControlMessage
from omni_trio.errors import MalformedMessage, describe_error

__all__ = [
    "OOB_EXT",
    "OOB_THRESHOLD",
    "MalformedMessage",
    "decode",
    "encode",
]

#: msgpack extension code marking an out-of-band bytes value.
OOB_EXT = 1
#: bytes values at least this long travel as their own frame.
OOB_THRESHOLD = 64 * 1024


def _take_oob(value: Any, frames: list[bytes]) -> Any:
    """Replace large bytes values (in maps and lists) by OOB extension markers."""
    kind = type(value)
    if kind is bytes:
        if len(value) < OOB_THRESHOLD:
            return value
        frames.append(value)
        return msgpack.ExtType(OOB_EXT, (len(frames) - 1).to_bytes(4, "big"))
    if kind is dict:
        return {k: v if type(v) in _SCALARS else _take_oob(v, frames) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [v if type(v) in _SCALARS else _take_oob(v, frames) for v in value]
    return value


#: Values :func:`_take_oob` returns as they are: checked before calling it (most of a message's fields
#: and of a DataRef map's values are these).
_SCALARS = frozenset({str, int, float, bool, type(None)})


_NO_DEFAULT = object()


@attrs.frozen
class _Layout:
    """What the codec needs of one message class: its tag, its fields with their defaults, the required ones."""

    tag: bytes
    fields: tuple[tuple[str, Any], ...]
    names: frozenset[str]
    required: tuple[str, ...]


def _layout(cls: type[ControlMessage]) -> _Layout:
    fields = tuple(
        (f.name, _NO_DEFAULT if f.default is attrs.NOTHING else f.default) for f in attrs.fields(cls)
    )
    return _Layout(
        tag=cls.TAG.encode("ascii"),
        fields=fields,
        names=frozenset(name for name, _ in fields),
        required=tuple(name for name, default in fields if default is _NO_DEFAULT),
    )


_LAYOUTS: dict[type[ControlMessage], _Layout] = {}


def _layout_of(cls: type[ControlMessage]) -> _Layout | None:
    layout = _LAYOUTS.get(cls)
    if layout is None and cls.TAG and MESSAGE_TYPES.get(cls.TAG) is cls:
        layout = _LAYOUTS[cls] = _layout(cls)
    return layout


def encode(msg: ControlMessage) -> list[bytes]:
    """Encode a registered control message into zmq frames.

    Raises TypeError if ``msg`` is not a registered message or a field
    (e.g. inside ``data_ref``/``stages``) is not msgpack-encodable.
    """
    layout = _layout_of(type(msg))
    if layout is None:
        raise TypeError(f"{type(msg).__name__} is not a registered control message")
    fields: dict[str, Any] = {}
    extra: list[bytes] = []
    for name, default in layout.fields:
        value = getattr(msg, name)
        if default is _NO_DEFAULT or value != default:
            fields[name] = value if type(value) in _SCALARS else _take_oob(value, extra)
    try:
        body: bytes = msgpack.packb(fields, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode {type(msg).__name__}: {exc}") from exc
    return [layout.tag, body, *extra]


def _as_bytes(frame: Any, what: str) -> bytes:
    if type(frame) is bytes:
        return frame
    if isinstance(frame, (bytearray, memoryview)):
        return bytes(frame)
    raise MalformedMessage(f"{what} is {type(frame).__name__}, not bytes")


def _decode(frames: Sequence[Any]) -> ControlMessage:
    if not isinstance(frames, (list, tuple)):
        raise MalformedMessage(f"expected a list of frames, got {type(frames).__name__}")
    if len(frames) < 2:
        raise MalformedMessage(f"expected at least 2 frames, got {len(frames)}")
    raw_tag = _as_bytes(frames[0], "tag frame")
    try:
        tag = raw_tag.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedMessage(f"non-ASCII message tag {raw_tag[:40]!r}") from None
    cls = MESSAGE_TYPES.get(tag)
    if cls is None:
        raise MalformedMessage(f"unknown message type {tag[:40]!r}")
    body = _as_bytes(frames[1], "body frame")
    extra = [_as_bytes(f, f"frame {i + 2}") for i, f in enumerate(frames[2:])]
    used = [False] * len(extra)

    def ext_hook(code: int, data: bytes) -> Any:
        if code != OOB_EXT or len(data) != 4:
            raise MalformedMessage(f"unexpected msgpack extension {code}")
        index = int.from_bytes(data, "big")
        if index >= len(extra) or used[index]:
            raise MalformedMessage(f"bad out-of-band frame reference {index}")
        used[index] = True
        return extra[index]

    fields = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True, ext_hook=ext_hook)
    if type(fields) is not dict:
        raise MalformedMessage(f"{tag}: body is {type(fields).__name__}, not a map")
    if not all(used):
        raise MalformedMessage(f"{tag}: {used.count(False)} unreferenced extra frame(s)")
    layout = _layout_of(cls)
    assert layout is not None
    if not layout.names.issuperset(fields):
        extras = sorted(str(key) for key in fields if key not in layout.names)
        raise MalformedMessage(f"{tag}: extra fields {', '.join(extras)[:200]}")
    missing = [name for name in layout.required if name not in fields]
    if missing:
        raise MalformedMessage(f"{tag}: required field missing: {', '.join(missing)}")
    try:
        # The class's validators check every field's type and value, and its invariants.
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise MalformedMessage(f"{tag}: {str(exc)[:500]}") from None


def decode(frames: Sequence[Any]) -> ControlMessage:
    """Decode zmq frames into a control message.

    Raises MalformedMessage, and only MalformedMessage, for any bad input.
    """
    try:
        return _decode(frames)
    except MalformedMessage:
        raise
    except Exception as exc:
        reason = describe_error(exc)
        raise MalformedMessage(f"malformed control message: {reason[:500]}") from exc
