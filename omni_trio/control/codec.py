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
class, whose validators (:mod:`omni_trio.control.messages`) check every field
strictly; the cost is a few microseconds per message. The ``converter``
(cattrs) is kept for DataRef maps (:mod:`omni_trio.comm.dataref`).
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import cattrs
import msgpack
from cattrs.v import format_exception

from omni_trio.control.messages import MESSAGE_TYPES, ControlMessage

__all__ = [
    "OOB_EXT",
    "OOB_THRESHOLD",
    "MalformedMessage",
    "converter",
    "decode",
    "describe_error",
    "encode",
]

#: msgpack extension code marking an out-of-band bytes value.
OOB_EXT = 1
#: bytes values at least this long travel as their own frame.
OOB_THRESHOLD = 64 * 1024


class MalformedMessage(ValueError):
    """A control message (or a DataRef inside one) failed to decode or validate.

    ``reason`` says what was wrong; the receiver logs it and drops the message.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _strict(tp: type) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _: Any) -> Any:
        # Exact type: bool is an int subclass, str(1) must not become "1".
        if type(value) is not tp:
            raise TypeError(f"expected {tp.__name__}, got {type(value).__name__}")
        return value

    return hook


def _structure_float(value: Any, _: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise TypeError(f"expected float, got {type(value).__name__}")


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, omit_if_default=True)
    for tp in (str, bytes, int, bool):
        conv.register_structure_hook(tp, _strict(tp))
    conv.register_structure_hook(float, _structure_float)

    def is_list(tp: Any) -> bool:
        return typing.get_origin(tp) is list

    def list_factory(tp: Any) -> Callable[[Any, Any], Any]:
        (item_type,) = typing.get_args(tp) or (Any,)
        item_hook = conv.get_structure_hook(item_type)

        def hook(value: Any, _: Any) -> list[Any]:
            if type(value) is not list:
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return [item_hook(v, item_type) for v in value]

        return hook

    def is_var_tuple(tp: Any) -> bool:
        args = typing.get_args(tp)
        return typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis

    def tuple_factory(tp: Any) -> Callable[[Any, Any], Any]:
        item_type = typing.get_args(tp)[0]
        item_hook = conv.get_structure_hook(item_type)

        def hook(value: Any, _: Any) -> tuple[Any, ...]:
            # msgpack arrays decode as lists; tuples come from in-process use.
            if type(value) is not list and type(value) is not tuple:
                raise TypeError(f"expected a list, got {type(value).__name__}")
            return tuple(item_hook(v, item_type) for v in value)

        return hook

    def is_dict(tp: Any) -> bool:
        return tp is dict or typing.get_origin(tp) is dict

    def dict_factory(tp: Any) -> Callable[[Any, Any], Any]:
        args = typing.get_args(tp)
        key_type, value_type = args if args else (Any, Any)
        key_hook = conv.get_structure_hook(key_type) if key_type is not Any else None
        value_hook = conv.get_structure_hook(value_type) if value_type is not Any else None

        def hook(value: Any, _: Any) -> dict[Any, Any]:
            if type(value) is not dict:
                raise TypeError(f"expected a map, got {type(value).__name__}")
            if key_hook is None and value_hook is None:
                return value
            return {
                (key_hook(k, key_type) if key_hook else k): (value_hook(v, value_type) if value_hook else v)
                for k, v in value.items()
            }

        return hook

    def structure_enum(value: Any, tp: Any) -> Any:
        if isinstance(value, tp):
            return value
        if type(value) is str or type(value) is int:
            try:
                return tp(value)
            except ValueError:
                pass
        raise ValueError(f"{value!r} is not a valid {tp.__name__}")

    def unstructure_enum(value: enum.Enum) -> Any:
        return value.value

    # Registered for StrEnum/IntEnum too: they are str/int subclasses and
    # dispatch (by MRO) would otherwise pick the strict str/int hooks.
    for base in (enum.Enum, enum.StrEnum, enum.IntEnum):
        conv.register_structure_hook(base, structure_enum)
        conv.register_unstructure_hook(base, unstructure_enum)

    conv.register_structure_hook_factory(is_list, list_factory)
    conv.register_structure_hook_factory(is_var_tuple, tuple_factory)
    conv.register_structure_hook_factory(is_dict, dict_factory)
    return conv


#: The converter shared by the codec and ``omni_trio.comm.dataref``.
converter = _make_converter()


def _take_oob(value: Any, frames: list[bytes]) -> Any:
    """Replace large bytes values (in maps and lists) by OOB extension markers."""
    kind = type(value)
    if kind is memoryview:
        # A tensor's own storage (omni_trio.comm.tcp): its own frame, sent without a copy.
        if value.nbytes < OOB_THRESHOLD:
            return value.tobytes()
        frames.append(value)
        return msgpack.ExtType(OOB_EXT, (len(frames) - 1).to_bytes(4, "big"))
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


def _format_leaf(exc: BaseException, type_: Any) -> str:
    base = format_exception(exc, type_)
    detail = str(exc)
    # cattrs' generic text ("invalid value") hides our validators' reasons.
    if detail and detail not in base and not isinstance(exc, KeyError):
        return f"{base} ({detail[:200]})"
    return base


def describe_error(exc: BaseException) -> str:
    """A one-line description of a (cattrs validation) error, for MalformedMessage."""
    if isinstance(exc, cattrs.BaseValidationError):
        try:
            return "; ".join(cattrs.transform_error(exc, format_exception=_format_leaf))
        except Exception:  # noqa: BLE001 - describing must never fail the decode
            pass
    return f"{type(exc).__name__}: {exc}"


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
