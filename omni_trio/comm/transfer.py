"""Moving one Python object (a payload, a chunk, a result) to another process.

:func:`encode_object` decides the transport of one object and writes it:

* **inline** — the pickled object travels inside the control message, with
  no relay and no ACK;
* **shm** — tensors are packed into one shared-memory segment (one transfer,
  one credit of the target), the tensor-free rest is pickled as the header;
  the receiver reads, unlinks and ACKs.

Which one is :mod:`omni_trio.comm.router`'s decision.

:func:`decode_object` is the receiving side. Pickle is used only for the
user-object parts, after the control message passed the codec's validation,
on owner-only IPC sockets (see docs/design.md, trust model).
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from omni_trio.comm.dataref import DataRef, DataRefKind, Layout, TransportKind, shm_buffer
from omni_trio.comm.router import INLINE_LIMIT, choose_transport
from omni_trio.comm.shm import ShmPut, ShmRelay, read_segment
from omni_trio.payload import OmniRequest, StagePayload

if TYPE_CHECKING:
    import torch

def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A small view of a big tensor must not drag its whole storage into a pickle."""
    tensor = tensor.detach()
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        return tensor.contiguous().clone()
    return tensor


def _inline_header(
    wrap: Callable[[Any], Any], stripped: object, tensors: dict[str, torch.Tensor]
) -> bytes | None:
    """The pickled object with its tensors, or None when it exceeds the inline limit."""
    if not tensors:
        return pickle.dumps(wrap(stripped), protocol=pickle.HIGHEST_PROTOCOL)
    from omni_trio.comm.packing import restore

    compact = {path: _compact(t) for path, t in tensors.items()}
    header = pickle.dumps(wrap(restore(stripped, compact)), protocol=pickle.HIGHEST_PROTOCOL)
    return header if len(header) <= INLINE_LIMIT else None


@attrs.frozen
class _PayloadParts:
    """A StagePayload on the wire: its request and data as one tuple, so the tensor
    walk (which descends into containers, not into objects) reaches them."""

    request_id: str
    parts: tuple[Any, Any, Any, Any]  # inputs, params, metadata, data

    def payload(self, parts: Any) -> StagePayload:
        """The StagePayload, from these parts (or their tensor-restored copy)."""
        inputs, params, metadata, data = parts
        return StagePayload(self.request_id, OmniRequest(inputs, params, metadata), data)


def _walkable(obj: object) -> tuple[Callable[[Any], Any], Any]:
    """``obj`` as containers the tensor walk can see, and how to wrap the result for the wire."""
    if isinstance(obj, StagePayload):
        request = obj.request
        parts = (request.inputs, request.params, request.metadata, obj.data)
        return (lambda walked: _PayloadParts(obj.request_id, walked)), parts
    return (lambda walked: walked), obj


def _unwrap(header: Any, tensors: Mapping[str, torch.Tensor] | None) -> Any:
    """The object a header stands for, with ``tensors`` (None: inline, already in it) put back."""
    parts = header.parts if isinstance(header, _PayloadParts) else header
    if tensors is not None:
        from omni_trio.comm.packing import restore

        parts = restore(parts, tensors)
    return header.payload(parts) if isinstance(header, _PayloadParts) else parts


async def encode_object(
    obj: object,
    *,
    relay: ShmRelay,
    sender: str,
    target: str,
    object_id: str,
    kind: DataRefKind,
    gpu_peers: bool = False,
) -> tuple[DataRef, ShmPut | None]:
    """Write ``obj`` for ``target``; return its DataRef and the relay put to settle (None inline).

    The transport comes from :func:`~omni_trio.comm.router.choose_transport`.
    Unsupported tensor dtypes raise here, at the sender. The put waits for a
    free credit of ``target``.
    """
    wrap, walkable = _walkable(obj)
    if "torch" not in sys.modules:
        # No tensor can exist in a process that never imported torch: skip the walk.
        stripped, tensors = walkable, dict[str, "torch.Tensor"]()
    else:
        from omni_trio.comm.packing import extract_tensors

        stripped, tensors = extract_tensors(walkable)
    transport = choose_transport(
        (t.device.type for t in tensors.values()),
        sum(t.numel() * t.element_size() for t in tensors.values()),
        sender=sender,
        receiver=target,
        gpu_peers=gpu_peers,
    )
    header = _inline_header(wrap, stripped, tensors) if transport is TransportKind.inline else None
    if header is not None:
        ref = DataRef(
            kind=kind, object_id=object_id, transport=TransportKind.inline, layout=Layout.packed_tensors, header=header
        )
        return ref, None
    from omni_trio.comm.packing import pack_tensors, write_packed

    total, entries = pack_tensors(tensors)
    put = await relay.put(target, total, lambda view: write_packed(view, tensors, entries))
    ref = DataRef(
        kind=kind,
        object_id=object_id,
        transport=TransportKind.shm,
        layout=Layout.packed_tensors,
        buffer=shm_buffer(put),
        header=pickle.dumps(wrap(stripped), protocol=pickle.HIGHEST_PROTOCOL),
        tensors=entries,
    )
    return ref, put


def _copy_out(view: memoryview) -> torch.Tensor:
    import torch

    buffer = torch.empty(view.nbytes, dtype=torch.uint8)
    source = torch.frombuffer(view, dtype=torch.uint8)
    try:
        buffer.copy_(source)
    finally:
        del source
    return buffer


async def decode_object(ref: DataRef, *, shm_prefix: str | None = None) -> Any:
    """Rebuild the object a DataRef points to (reading and unlinking its segment)."""
    if ref.header is None:
        raise ValueError(f"DataRef {ref.object_id} has no header")
    if ref.transport is TransportKind.inline:
        return _unwrap(pickle.loads(ref.header), None)
    if ref.transport is not TransportKind.shm or ref.buffer is None:
        raise ValueError(f"DataRef {ref.object_id}: transport {ref.transport} is not available in this runtime")
    from omni_trio.comm.packing import unpack_tensors

    info = ref.buffer.info
    buffer = await read_segment(info["shm_name"], ref.buffer.length, _copy_out, prefix=shm_prefix)
    return _unwrap(pickle.loads(ref.header), unpack_tensors(buffer, ref.tensors))
