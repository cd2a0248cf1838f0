"""Moving one Python object (a payload, a chunk, a result) to another process.

:func:`encode_object` decides the transport of one object and writes it:

* **inline** — the pickled object travels inside the control message, with
  no relay and no ACK: always for tensor-free objects (their header would
  travel in the control message anyway), and for objects whose tensors hold
  at most 16 KiB and whose pickle is at most 16 KiB (SPEC §8.9);
* **shm** — tensors are packed into one shared-memory segment (one transfer,
  one credit of the target), the tensor-free rest is pickled as the header;
  the receiver reads, unlinks and ACKs.

:func:`decode_object` is the receiving side. Pickle is used only for the
user-object parts, after the control message passed the codec's validation,
on owner-only IPC sockets (see docs/design.md, trust model).
"""

from __future__ import annotations

import pickle
import sys
from typing import TYPE_CHECKING, Any

from omni_trio.comm.dataref import DataRef, DataRefKind, Layout, TransportKind, shm_buffer
from omni_trio.comm.shm import ShmPut, ShmRelay, read_segment

if TYPE_CHECKING:
    import torch

#: Largest tensor data and pickled size sent inside a control message (SPEC §8.9).
INLINE_LIMIT = 16 * 1024


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """A small view of a big tensor must not drag its whole storage into a pickle."""
    tensor = tensor.detach()
    if tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size():
        return tensor.contiguous().clone()
    return tensor


def _inline_header(stripped: object, tensors: dict[str, torch.Tensor]) -> bytes | None:
    if not tensors:
        return pickle.dumps(stripped, protocol=pickle.HIGHEST_PROTOCOL)
    from omni_trio.comm.packing import restore

    if any(t.device.type != "cpu" for t in tensors.values()):
        return None
    if sum(t.numel() * t.element_size() for t in tensors.values()) > INLINE_LIMIT:
        return None
    header = pickle.dumps(
        restore(stripped, {path: _compact(t) for path, t in tensors.items()}), protocol=pickle.HIGHEST_PROTOCOL
    )
    return header if len(header) <= INLINE_LIMIT else None


async def encode_object(
    obj: object, *, relay: ShmRelay, target: str, object_id: str, kind: DataRefKind
) -> tuple[DataRef, ShmPut | None]:
    """Write ``obj`` for ``target``; return its DataRef and the relay put to settle (None inline).

    Unsupported tensor dtypes raise here, at the sender. The put waits for a
    free credit of ``target``.
    """
    if "torch" not in sys.modules:
        # No tensor can exist in a process that never imported torch: skip the walk.
        stripped, tensors = obj, dict[str, "torch.Tensor"]()
    else:
        from omni_trio.comm.packing import extract_tensors

        stripped, tensors = extract_tensors(obj)
    header = _inline_header(stripped, tensors)
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
        header=pickle.dumps(stripped, protocol=pickle.HIGHEST_PROTOCOL),
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
        return pickle.loads(ref.header)
    if ref.transport is not TransportKind.shm or ref.buffer is None:
        raise ValueError(f"DataRef {ref.object_id}: transport {ref.transport} is not available in this runtime")
    from omni_trio.comm.packing import restore, unpack_tensors

    info = ref.buffer.info
    buffer = await read_segment(info["shm_name"], ref.buffer.length, _copy_out, prefix=shm_prefix)
    stripped = pickle.loads(ref.header)
    return restore(stripped, unpack_tensors(buffer, ref.tensors))
