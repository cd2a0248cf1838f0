"""Moving one Python object (a payload, a chunk, a result) to another process.

:func:`encode_object` decides the transport of one object and writes it:

* **inline** — the pickled object travels inside the control message, with
  no relay and no ACK;
* **tcp** — to a process on another host: the header in the message, the
  tensors' bytes offered on the sender's bulk listener, fetched by the
  receiver (:mod:`omni_trio.comm.tcp`);
* **shm** — tensors are packed into one shared-memory segment (one transfer,
  one credit of the target), the tensor-free rest is pickled as the header.
  For a pooled slot the receiver builds its tensors as views of the slot (no
  copy) and reports, through ``on_release``, when the last of them is gone;
  for a one-shot segment it copies the bytes out and unlinks it. Either way
  it ACKs the read. Tensors the sending stage built in one slot with
  ``ot.empty`` (:mod:`omni_trio.comm.alloc`) are not copied: that slot is lent.

Whether an object goes inline is :mod:`omni_trio.comm.router`'s decision; the rest goes as
``tcp`` when the caller passes TCP credits (the target is on another host), else as ``shm``.

:func:`decode_object` is the receiving side. Pickle is used only for the
user-object parts, after the control message passed the codec's validation,
on owner-only IPC sockets (see docs/design.md, trust model).
"""

from __future__ import annotations

import functools
import pickle
import sys
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import attrs

from omni_trio.comm.bulk import BulkFetcher
from omni_trio.comm.dataref import BufferRef, DataRef, DataRefKind, Layout, TransportKind, shm_buffer
from omni_trio.comm.layout import ChunkRun, TensorRun
from omni_trio.comm.oneshot import read_segment
from omni_trio.comm.router import INLINE_LIMIT, choose_transport
from omni_trio.comm.shm import ShmPut, ShmRelay
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.comm.tcp import TcpCredits, TcpPut, fetch_tensors, tensor_frame
from omni_trio.payload import OmniRequest, StagePayload

if TYPE_CHECKING:
    import torch

    from omni_trio.comm.alloc import SlotAllocator

@attrs.frozen
class _PackedInline:
    """An inline object whose tensors travel beside it as packed bytes.

    torch pickles a tensor in tens of microseconds (and unpickles it in
    more); packing its bytes costs about one, which is what makes a stream
    of small tensor chunks cheap. ``obj`` holds placeholders where the
    tensors were, as the header of a shared-memory transfer does; ``runs``
    lay the bytes out (a stream's chunks: one run, not an entry each).
    """

    obj: Any
    runs: tuple[TensorRun, ...]
    data: bytearray

    def __reduce__(self) -> tuple[type[_PackedInline], tuple[Any, tuple[TensorRun, ...], bytearray]]:
        # Its fields as a tuple: attrs' state dict and its __getstate__/__setstate__ calls cost more
        # than the rest of a small chunk's header (measured with cold caches, as a chunk finds them).
        return (_PackedInline, (self.obj, self.runs, self.data))


def _inline_header(
    wrap: Callable[[Any], Any], stripped: object, tensors: dict[str, torch.Tensor]
) -> bytes | None:
    """The pickled object with its tensors packed beside it, or None when it exceeds the inline limit."""
    if not tensors:
        return pickle.dumps(wrap(stripped), protocol=pickle.HIGHEST_PROTOCOL)
    from omni_trio.comm.packing import pack_runs, write_runs

    total, runs = pack_runs(tensors)
    data = bytearray(total)
    write_runs(memoryview(data), tensors, runs)
    header = pickle.dumps(_PackedInline(wrap(stripped), tuple(runs), data), protocol=pickle.HIGHEST_PROTOCOL)
    return header if len(header) <= INLINE_LIMIT else None


@attrs.frozen
class _PayloadParts:
    """A StagePayload on the wire: its request and data as one tuple, so the tensor
    walk (which descends into containers, not into objects) reaches them."""

    request_id: str
    parts: tuple[Any, Any, Any, Any]  # inputs, params, metadata, data

    def __reduce__(self) -> tuple[type[_PayloadParts], tuple[str, tuple[Any, Any, Any, Any]]]:
        # As _PackedInline's: every payload hop pickles one; attrs' state dict cost ~3 µs more to write
        # and ~1-2 µs more to read, cold, and 25 bytes more on the wire.
        return (_PayloadParts, (self.request_id, self.parts))

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
        from omni_trio.comm.tensor_walk import restore

        parts = restore(parts, tensors)
    return header.payload(parts) if isinstance(header, _PayloadParts) else parts


def _split(obj: object) -> tuple[Callable[[Any], Any], object, dict[str, torch.Tensor]]:
    """How to wrap ``obj`` for the wire, ``obj`` with tensors replaced by placeholders, and its tensors."""
    wrap, walkable = _walkable(obj)
    if "torch" not in sys.modules:
        # No tensor can exist in a process that never imported torch: skip the walk.
        return wrap, walkable, {}
    from omni_trio.comm.tensor_walk import extract_tensors

    stripped, tensors = extract_tensors(walkable)
    return wrap, stripped, tensors


def tensor_bytes(obj: object) -> int:
    """The bytes of the tensors ``obj`` carries (what a trace's ``bytes`` reports; 0 for none).

    Counted without extracting them (:func:`~omni_trio.comm.tensor_walk.tensor_nbytes`): in-process
    edges count every payload they hand over, and nothing else walks it there.
    """
    if "torch" not in sys.modules:
        return 0  # no tensor can exist in a process that never imported torch
    count = _tensor_walk().tensor_nbytes
    if isinstance(obj, StagePayload):
        request = obj.request
        return count((request.inputs, request.params, request.metadata, obj.data))
    return count(obj)


@functools.cache
def _tensor_walk() -> ModuleType:
    """:mod:`omni_trio.comm.tensor_walk`, imported on first use (it imports torch) and then cached:
    an import statement run on every call costs a third of the count itself."""
    from omni_trio.comm import tensor_walk

    return tensor_walk


def _inline_ref(
    wrap: Callable[[Any], Any],
    stripped: object,
    tensors: dict[str, torch.Tensor],
    *,
    sender: str,
    target: str,
    object_id: str,
    kind: DataRefKind,
    gpu_peers: bool,
) -> DataRef | None:
    """The inline DataRef of a split object, or None when the router does not send it inline."""
    nbytes = sum(t.nbytes for t in tensors.values())
    transport = choose_transport(
        {"cpu" if t.is_cpu else t.device.type for t in tensors.values()},  # is_cpu: no device object built
        nbytes,
        sender=sender,
        receiver=target,
        gpu_peers=gpu_peers,
    )
    header = _inline_header(wrap, stripped, tensors) if transport is TransportKind.inline else None
    return None if header is None else _inline_dataref(header, nbytes, object_id=object_id, kind=kind)


def _inline_dataref(header: bytes, nbytes: int, *, object_id: str, kind: DataRefKind) -> DataRef:
    """The DataRef of an object that travels as ``header`` (carrying ``nbytes`` of tensors) in its message."""
    return DataRef(
        kind=kind,
        object_id=object_id,
        transport=TransportKind.inline,
        layout=Layout.packed_tensors,
        header=header,
        tensor_bytes=nbytes,
    )


def _chunk_run_ref(
    obj: object, *, sender: str, target: str, object_id: str, kind: DataRefKind, gpu_peers: bool
) -> DataRef | None:
    """The inline DataRef of a run of alike chunks (:mod:`omni_trio.comm.chunk_runs`), or None for
    anything else and for a run the router does not send inline."""
    if type(obj) is not list or "torch" not in sys.modules:
        return None
    run = _chunk_runs().pack_chunk_run(obj)
    if run is None:
        return None
    transport = choose_transport({"cpu"}, len(run.data), sender=sender, receiver=target, gpu_peers=gpu_peers)
    if transport is not TransportKind.inline:
        return None
    header = pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL)
    if len(header) > INLINE_LIMIT:
        return None
    return _inline_dataref(header, len(run.data), object_id=object_id, kind=kind)


@functools.cache
def _chunk_runs() -> ModuleType:
    """:mod:`omni_trio.comm.chunk_runs`, imported on first use (it imports torch), then cached."""
    from omni_trio.comm import chunk_runs

    return chunk_runs


def encode_inline(
    obj: object, *, sender: str, target: str, object_id: str, kind: DataRefKind, gpu_peers: bool = False
) -> DataRef | None:
    """``obj``'s inline DataRef (what :func:`encode_object` sends inline), or None if it would not go inline."""
    run = _chunk_run_ref(obj, sender=sender, target=target, object_id=object_id, kind=kind, gpu_peers=gpu_peers)
    if run is not None:
        return run
    wrap, stripped, tensors = _split(obj)
    return _inline_ref(
        wrap, stripped, tensors, sender=sender, target=target, object_id=object_id, kind=kind, gpu_peers=gpu_peers
    )


async def encode_object(
    obj: object,
    *,
    relay: ShmRelay,
    sender: str,
    target: str,
    object_id: str,
    kind: DataRefKind,
    gpu_peers: bool = False,
    allocator: SlotAllocator | None = None,
    tcp: TcpCredits | None = None,
) -> tuple[DataRef, ShmPut | TcpPut | None]:
    """Write ``obj`` for ``target``; return its DataRef and the put to settle (None inline).

    The transport comes from :func:`~omni_trio.comm.router.choose_transport`. With ``tcp``
    (``target`` is on another host) what would go through shared memory is offered on the
    process's bulk listener instead (:mod:`omni_trio.comm.tcp`). Otherwise tensors that lie in one slot of
    ``allocator`` (``ot.empty``) are sent by reference, without a copy.
    Unsupported tensor dtypes raise here, at the sender. The put waits for a
    free credit of ``target``.
    """
    run = _chunk_run_ref(obj, sender=sender, target=target, object_id=object_id, kind=kind, gpu_peers=gpu_peers)
    if run is not None:
        return run, None
    wrap, stripped, tensors = _split(obj)
    ref = _inline_ref(
        wrap, stripped, tensors, sender=sender, target=target, object_id=object_id, kind=kind, gpu_peers=gpu_peers
    )
    if ref is not None:
        return ref, None
    from omni_trio.comm.packing import pack_tensors, write_packed

    if tcp is not None:
        total, entries = pack_tensors(tensors)
        tcp_put = await tcp.put(target, [tensor_frame(tensors[entry.path]) for entry in entries])
        ref = DataRef(
            kind=kind,
            object_id=object_id,
            transport=TransportKind.tcp,
            layout=Layout.packed_tensors,
            buffer=BufferRef(transport=TransportKind.tcp, info=tcp_put.info, length=total),
            header=pickle.dumps(wrap(stripped), protocol=pickle.HIGHEST_PROTOCOL),
            tensors=entries,
            tensor_bytes=total,
        )
        return ref, tcp_put
    lent = None if allocator is None else await allocator.lend(target, tensors)
    if lent is not None:
        put, plan = lent
        entries = plan.entries
        if plan.extras:
            from omni_trio.comm.tensor_walk import restore

            # The few tensors outside the slot are pickled with the header (at most 16 KiB of them).
            stripped = restore(stripped, plan.extras, partial=True)
    else:
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
        tensor_bytes=sum(entry.size for entry in entries),
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


async def decode_object(
    ref: DataRef,
    *,
    shm_prefix: str | None = None,
    segments: SegmentCache | None = None,
    on_release: Callable[[], None] | None = None,
    bulk: BulkFetcher | None = None,
) -> Any:
    """Rebuild the object a DataRef points to.

    A ``tcp`` DataRef's tensors are fetched with ``bulk`` (from the sender's bulk listener).

    One-shot segment: read (copied out) and unlinked. Pooled slot
    (``ref.buffer.pooled``): with ``segments``, the tensors are views of the
    slot's cached mapping, and ``on_release()`` is called once none of them is
    alive any more (from whichever thread drops the last one, possibly inside
    the garbage collector: it must be thread-safe and must not block). Without
    ``segments`` the slot is copied out and ``on_release()`` called before
    returning. ``on_release`` may also be called when the decode fails after
    the slot was mapped.
    """
    if ref.header is None:
        raise ValueError(f"DataRef {ref.object_id} has no header")
    if ref.transport is TransportKind.inline:
        header = pickle.loads(ref.header)
        if isinstance(header, ChunkRun):
            return _chunk_runs().unpack_chunk_run(header)
        if isinstance(header, _PackedInline):
            from omni_trio.comm.packing import unpack_runs

            return _unwrap(header.obj, unpack_runs(header.data, header.runs))
        return _unwrap(header, None)
    if ref.transport is TransportKind.tcp:
        if bulk is None or ref.buffer is None:
            raise ValueError(f"DataRef {ref.object_id}: a tcp transfer, and no bulk connections to fetch it")
        tensors = await fetch_tensors(bulk, ref.buffer.info, ref.tensors, ref.buffer.length)
        return _unwrap(pickle.loads(ref.header), tensors)
    if ref.buffer is None:
        raise ValueError(f"DataRef {ref.object_id}: a shm transfer without a buffer")
    from omni_trio.comm.packing import unpack_tensors

    info = ref.buffer.info
    if not ref.buffer.pooled:
        buffer = await read_segment(info["shm_name"], ref.buffer.length, _copy_out, prefix=shm_prefix)
        return _unwrap(pickle.loads(ref.header), unpack_tensors(buffer, ref.tensors))
    if segments is None:
        cache = SegmentCache(max_bytes=0)
        try:
            owner = await cache.view(info["shm_name"], info["segment_size"], ref.buffer.length, prefix=shm_prefix)
            import torch

            buffer = torch.from_numpy(owner).clone()
            del owner
        finally:
            cache.clear()
            if on_release is not None:
                on_release()
        return _unwrap(pickle.loads(ref.header), unpack_tensors(buffer, ref.tensors))
    return await _decode_pooled(ref, segments, shm_prefix, on_release)


async def _decode_pooled(
    ref: DataRef, segments: SegmentCache, shm_prefix: str | None, on_release: Callable[[], None] | None
) -> Any:
    import torch

    from omni_trio.comm.packing import unpack_tensors

    assert ref.buffer is not None and ref.header is not None
    name = ref.buffer.info["shm_name"]
    owner = await segments.view(name, ref.buffer.info["segment_size"], ref.buffer.length, prefix=shm_prefix)
    if on_release is not None:
        # Every tensor made below keeps ``owner`` alive (torch.from_numpy holds
        # it, views share that storage): its finalizer runs when the last one
        # is gone. Not at interpreter exit: the sender unlinks its slots itself.
        weakref.finalize(owner, on_release).atexit = False
    try:
        tensors = unpack_tensors(torch.from_numpy(owner), ref.tensors)
        del owner
        return _unwrap(pickle.loads(ref.header), tensors)
    except BaseException:
        # The sender retires a slot whose read failed: do not keep mapping it.
        segments.discard(name)
        raise
