"""DataRef: the control-plane pointer to one data-plane object.

A DataReady's ``data_ref`` is ``DataRef.to_wire()``: a plain map (msgpack
friendly, ``_type: "DataRef"``, ``version: 1``). The receiver calls
:meth:`DataRef.from_wire`, which validates types *and* layout consistency
(entries inside the buffer, aligned, sizes matching shape x dtype, known
dtypes), so the unpacking code can trust what it gets. Anything wrong raises
:class:`~omni_trio.errors.MalformedMessage`.

Its one layout, ``packed_tensors`` (payloads, chunks with metadata tensors):
``header`` (pickled object with
:class:`~omni_trio.comm.tensor_walk.TensorPlaceholder`) plus ``tensors``
entries into one buffer. A chunk and its metadata tensors are packed into one
buffer = one transfer = one credit. A DataRef only travels
between processes, so its transport is ``inline``, ``shm`` or ``tcp``.

``buffer`` is ``{transport, info, length}``: ``info`` is the relay's put
metadata verbatim (shm: ``{"shm_name", "size"}`` with ``size == length``, plus
``"segment_size"`` (>= ``size``) and ``"lease"`` (>= 0) for a pooled slot,
whose tensors the receiver views in place and whose release it reports; see
:mod:`omni_trio.comm.shm`).
It may be absent when there are no bytes to move (a tensor-free payload
whose header travels inline).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any

import attrs
from cattrs.gen import make_dict_unstructure_fn, override

from omni_trio.comm.layout import ELEMENT_SIZES, TensorEntry
from omni_trio.comm.shm import ShmPut
from omni_trio.comm.strict import describe_invalid, strict_converter
from omni_trio.comm.tcp import bulk_info
from omni_trio.errors import MalformedMessage

__all__ = [
    "DATAREF_TYPE",
    "DATAREF_VERSION",
    "WIRE_TRANSPORTS",
    "BufferRef",
    "DataRef",
    "DataRefKind",
    "Layout",
    "TransportKind",
    "shm_buffer",
]

DATAREF_TYPE = "DataRef"
DATAREF_VERSION = 1


class TransportKind(enum.StrEnum):
    """How the bytes of one object travel (the names the trace's ``comm_transport_selected`` uses)."""

    local_object = "local_object"  # same process: the Python object itself (never a DataRef)
    local_copy = "local_copy"  # same process, isolated copy (never a DataRef)
    inline = "inline"  # inside the control message
    shm = "shm"  # POSIX shared memory segment (omni_trio.comm.shm)
    tcp = "tcp"  # a bulk connection between hosts (omni_trio.comm.tcp)


#: The transports a DataRef may name: those that cross a process boundary.
WIRE_TRANSPORTS = frozenset({TransportKind.inline, TransportKind.shm, TransportKind.tcp})


class DataRefKind(enum.StrEnum):
    """What the object is."""

    stage_payload = "stage_payload"
    stream_chunk = "stream_chunk"


class Layout(enum.StrEnum):
    """How the bytes in the buffer are organised (one layout; the field keeps the wire map's shape)."""

    packed_tensors = "packed_tensors"


def _nonneg_int(value: object) -> bool:
    return type(value) is int and value >= 0


@attrs.frozen(kw_only=True)
class BufferRef:
    """Where the bytes are: the relay kind, its put metadata, the byte length."""

    transport: TransportKind
    info: dict[str, Any]
    length: int

    def __attrs_post_init__(self) -> None:
        if not _nonneg_int(self.length):
            raise ValueError(f"buffer length must be an int >= 0, got {self.length!r}")
        if self.transport is TransportKind.shm:
            name = self.info.get("shm_name")
            size = self.info.get("size")
            if type(name) is not str or not name:
                raise ValueError("shm buffer info needs a non-empty 'shm_name'")
            if size != self.length or type(size) is not int:
                raise ValueError(f"shm buffer info size {size!r} != buffer length {self.length}")
            if ("segment_size" in self.info) != ("lease" in self.info):
                raise ValueError("shm buffer info needs both 'segment_size' and 'lease', or neither")
            if "lease" in self.info:
                segment_size, lease = self.info["segment_size"], self.info["lease"]
                if not _nonneg_int(segment_size) or segment_size < self.length or segment_size < 1:
                    raise ValueError(f"shm buffer info segment_size {segment_size!r} < buffer length {self.length}")
                if not _nonneg_int(lease):
                    raise ValueError(f"shm buffer info lease must be an int >= 0, got {lease!r}")
        elif self.transport is TransportKind.tcp:
            bulk_info(self.info)

    @property
    def pooled(self) -> bool:
        """True for a pooled shared-memory slot (the receiver views it and releases it)."""
        return self.transport is TransportKind.shm and "lease" in self.info


def _check_extent(what: str, shape: tuple[int, ...], dtype: str, offset: int, size: int, length: int | None) -> None:
    if dtype not in ELEMENT_SIZES:
        raise ValueError(f"{what}: unsupported dtype {dtype!r}")
    if any(type(d) is not int or d < 0 for d in shape):
        raise ValueError(f"{what}: bad shape {shape!r}")
    elem = ELEMENT_SIZES[dtype]
    if size != math.prod(shape) * elem:
        raise ValueError(f"{what}: size {size} does not match shape {shape} x {elem} bytes")
    if not _nonneg_int(offset) or offset % elem:
        raise ValueError(f"{what}: offset {offset!r} is not aligned to {elem} bytes")
    if size and length is None:
        raise ValueError(f"{what}: tensor bytes but no buffer")
    if length is not None and offset + size > length:
        raise ValueError(f"{what}: [{offset}, {offset + size}) exceeds the buffer length {length}")


def _entry_tuple(entries: Iterable[TensorEntry]) -> tuple[TensorEntry, ...]:
    return tuple(entries)


@attrs.frozen(kw_only=True)
class DataRef:
    """Control-plane pointer to one data-plane object. See the module docstring."""

    kind: DataRefKind
    object_id: str
    transport: TransportKind
    layout: Layout
    buffer: BufferRef | None = None
    header: bytes | None = None
    tensors: tuple[TensorEntry, ...] = attrs.field(default=(), converter=_entry_tuple)
    #: chunk metadata with tensors removed (must be msgpack-encodable).
    metadata: dict[str, Any] | None = None
    version: int = DATAREF_VERSION
    #: The tensor bytes the object carries, as the sender counted them (for ``stats()``); never on the wire.
    tensor_bytes: int = attrs.field(default=0, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.version != DATAREF_VERSION or type(self.version) is not int:
            raise ValueError(f"unsupported DataRef version {self.version!r}")
        if type(self.object_id) is not str or not self.object_id:
            raise ValueError("object_id must be a non-empty string")
        if self.transport not in WIRE_TRANSPORTS:
            raise ValueError(f"a DataRef crosses processes: transport inline, shm or tcp, not {self.transport!r}")
        length = self.buffer.length if self.buffer is not None else None
        paths: set[str] = set()
        for entry in self.tensors:
            if entry.path in paths:
                raise ValueError(f"duplicate tensor path {entry.path!r}")
            paths.add(entry.path)
            _check_extent(f"tensor {entry.path!r}", entry.shape, entry.dtype, entry.offset, entry.size, length)

    @property
    def nbytes(self) -> int:
        """Bytes moved through the relay (0 without a buffer)."""
        return self.buffer.length if self.buffer is not None else 0

    @property
    def wire_bytes(self) -> int:
        """Bytes the object takes on the way: its inline header plus what moves through the relay."""
        return len(self.header or b"") + self.nbytes

    def to_wire(self) -> dict[str, Any]:
        """This DataRef as a msgpack-friendly map for ``DataReady.data_ref``."""
        if self.buffer is None and not self.tensors:
            return self._inline_wire()
        wire: dict[str, Any] = converter.unstructure(self)
        wire["_type"] = DATAREF_TYPE
        return wire

    def _inline_wire(self) -> dict[str, Any]:
        # A ref without buffer or tensor entries (every inline object: the common case) is the map of
        # :data:`_INLINE_KEYS`, built by hand as :func:`_inline_from_wire` reads it: the same map, in the
        # same order, as the converter's (defaults left out, the version always in).
        wire: dict[str, Any] = {
            "kind": str(self.kind),
            "object_id": self.object_id,
            "transport": str(self.transport),
            "layout": str(self.layout),
            "version": self.version,
        }
        if self.header is not None:
            wire["header"] = self.header
        if self.metadata is not None:
            wire["metadata"] = self.metadata
        wire["_type"] = DATAREF_TYPE
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> DataRef:
        """Parse and validate a wire map; raises MalformedMessage (only) on bad input."""
        if type(wire) is not dict:
            raise MalformedMessage(f"data_ref is {type(wire).__name__}, not a map")
        if wire.get("_type") != DATAREF_TYPE:
            raise MalformedMessage(f"data_ref _type is {wire.get('_type')!r}, expected {DATAREF_TYPE!r}")
        version = wire.get("version")
        if type(version) is not int or version != DATAREF_VERSION:
            raise MalformedMessage(f"unsupported DataRef version {version!r}")
        if _INLINE_KEYS.issuperset(wire):
            return _inline_from_wire(wire)
        fields = {k: v for k, v in wire.items() if k != "_type"}
        try:
            ref: DataRef = converter.structure(fields, cls)
        except Exception as exc:
            raise MalformedMessage(f"malformed DataRef: {describe_invalid(exc)[:500]}") from exc
        return ref


#: The keys of a DataRef without buffer or tensor entries (every inline object): the common case,
#: parsed without cattrs.
_INLINE_KEYS = frozenset({"_type", "version", "kind", "object_id", "transport", "layout", "header", "metadata"})


#: The enum fields of an inline ref's map: (key, enum class, its members by value).
_INLINE_ENUMS: tuple[tuple[str, type[enum.StrEnum], dict[str, Any]], ...] = tuple(
    (key, enum_class, {member.value: member for member in enum_class})
    for key, enum_class in (("kind", DataRefKind), ("transport", TransportKind), ("layout", Layout))
)


def _inline_from_wire(wire: dict[str, Any]) -> DataRef:
    """:meth:`DataRef.from_wire` of a map with only :data:`_INLINE_KEYS`: the same checks, done by hand."""
    problems: list[str] = []
    members: list[Any] = []
    for key, enum_class, by_value in _INLINE_ENUMS:
        value = wire.get(key)
        member = by_value.get(value) if type(value) is str else None
        if type(value) is not str:
            problems.append(f"{key} must be a string, got {type(value).__name__}")
        elif member is None:
            problems.append(f"{value!r} is not a valid {enum_class.__name__}")
        members.append(member)
    header, metadata = wire.get("header"), wire.get("metadata")
    if header is not None and type(header) is not bytes:
        problems.append(f"header must be bytes, got {type(header).__name__}")
    if metadata is not None and (type(metadata) is not dict or any(type(key) is not str for key in metadata)):
        problems.append("metadata must be a map with string keys")
    if problems:
        raise MalformedMessage(f"malformed DataRef: {'; '.join(problems)}")
    kind, transport, layout = members
    try:
        return DataRef(
            kind=kind,
            object_id=wire.get("object_id"),  # type: ignore[arg-type]  # DataRef checks it
            transport=transport,
            layout=layout,
            header=header,
            metadata=metadata,
        )
    except (TypeError, ValueError) as exc:
        raise MalformedMessage(f"malformed DataRef: {str(exc)[:500]}") from None


#: DataRef maps to and from attrs classes (exact types only).
converter = strict_converter()
# Fields equal to their default stay off the wire (an inline ref is four keys and a header), but the
# version is part of the wire contract: always write it. The sender's byte count stays home.
converter.register_unstructure_hook(
    DataRef,
    make_dict_unstructure_fn(
        DataRef,
        converter,
        _cattrs_omit_if_default=True,
        version=override(omit_if_default=False),
        tensor_bytes=override(omit=True),
    ),
)


def shm_buffer(put: ShmPut) -> BufferRef:
    """The BufferRef of a :class:`~omni_trio.comm.shm.ShmPut`."""
    return BufferRef(transport=TransportKind.shm, info=put.info(), length=put.size)
