"""``ot.empty``: a stage's output tensor built directly in its shared-memory slot pool.

A stage that returns a big tensor normally has it copied into a pooled slot of its
:class:`~omni_trio.comm.shm.ShmRelay` on the way out (one memcpy of the whole tensor, on
the sender). :func:`empty` hands out a tensor that *is* a pooled slot: when the object that
holds it goes to a stage in another process, the relay lends that slot as it is
(:meth:`ShmRelay.lend`) and only its name, lease and tensor offsets travel; the receiver maps
the slot without a copy, as for any pooled transfer.

Which stage's pool: the runtime binds a :class:`SlotAllocator` to the stage's scheduler thread
(:func:`allocating`, a context variable), and schedulers that start threads of their own copy
the context into them. Anywhere else (outside a stage, an embedded pipeline, compute on the
event loop: ``SimpleScheduler(inline=True)``, which must never wait for a slot) and for
tensors of at most :data:`~omni_trio.comm.router.INLINE_LIMIT` bytes (they travel inside the
control message anyway), :func:`empty` is ``torch.empty``. So is it when the pool has no room:
the ``zero_copy_fallback`` trace event says why.

Lifetime: the slot is held while any tensor of the sender views it (the tensor, its views, a
``.numpy()`` of it) and, once lent, until the receiver ACKed and dropped its views (the usual
release path); only then does it go back to the pool. So a tensor kept after it was sent stays
valid and its slot is never handed out again under it; but it is the memory the receiver reads:
writing to it after the send is a data race (undefined for the receiver). Sending:
:meth:`SlotAllocator.lend` sends an object by reference when its tensors are contiguous views of
one held slot (each by its offset) plus at most 16 KiB of other tensors (pickled in the header);
otherwise, and for a second send of a slot that is still lent, the tensors are copied as usual.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from omni_trio.comm.router import INLINE_LIMIT
from omni_trio.tracing.trace import Tracer

if TYPE_CHECKING:
    import torch

    from omni_trio.comm.layout import TensorEntry
    from omni_trio.comm.shm import ShmPut, ShmRelay

__all__ = ["LendPlan", "SlotAllocator", "allocating", "empty", "empty_like"]

_CURRENT: contextvars.ContextVar[SlotAllocator | None] = contextvars.ContextVar("omni_trio_allocator", default=None)


@attrs.frozen
class LendPlan:
    """How an object's tensors lie in one held slot: the slot, the packed entries of the tensors in
    it, the bytes to send, and the object's other (small) tensors, which travel in the header."""

    name: str
    entries: list[TensorEntry]
    length: int
    extras: dict[str, torch.Tensor]


@attrs.define(eq=False)
class _Held:
    name: str
    nbytes: int


class SlotAllocator:
    """Hands out tensors backed by held slots of one sending stage's relay; build it on the trio loop.

    ``relay()`` returns the stage's relay (made on first use), None once the process is shutting down
    (then nothing more is allocated); ``stage`` names the stage in traces.
    :meth:`empty` may be called from any thread but the loop's own.
    """

    def __init__(self, relay: Callable[[], ShmRelay | None], *, stage: str, tracer: Tracer) -> None:
        self._relay = relay
        self._stage = stage
        self._tracer = tracer
        self._token = trio.lowlevel.current_trio_token()
        self._loop_thread = threading.get_ident()
        # Storage address -> held slot. Touched on the loop thread only.
        self._held: dict[int, _Held] = {}
        #: Objects sent by reference so far.
        self.sent_by_reference = 0

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` in a held slot, or from ``torch.empty`` (see the module docstring)."""
        import torch

        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes <= INLINE_LIMIT:
            return torch.empty(shape, dtype=dtype)
        if threading.get_ident() == self._loop_thread:
            return self._fallback(shape, dtype, nbytes, "called on the event loop, which must not wait for a slot")
        try:
            array = trio.from_thread.run(self._borrow_slot, nbytes, trio_token=self._token)
        except (trio.RunFinishedError, trio.Cancelled, trio.ClosedResourceError):
            return self._fallback(shape, dtype, nbytes, "the stage's process is shutting down")
        except OSError as exc:  # a plain allocation may still work where a new segment did not
            return self._fallback(shape, dtype, nbytes, f"no shared-memory slot: {exc}")
        if array is None:
            return self._fallback(shape, dtype, nbytes, "no free room in the shared-memory pool")
        return torch.from_numpy(array).view(dtype).view(tuple(shape))

    def _fallback(self, shape: Sequence[int], dtype: torch.dtype, nbytes: int, reason: str) -> torch.Tensor:
        import torch

        if self._tracer.enabled:
            self._tracer.event("zero_copy_fallback", stage=self._stage, bytes=nbytes, reason=reason)
        return torch.empty(tuple(shape), dtype=dtype)

    async def _borrow_slot(self, nbytes: int) -> Any:
        import numpy

        relay = self._relay()
        if relay is None:
            raise trio.ClosedResourceError("the stage's process is shutting down")
        held = await relay.borrow_slot(nbytes)
        if held is None:
            return None
        name, mm = held
        array = numpy.frombuffer(mm, dtype=numpy.uint8, count=nbytes)
        self._held[array.ctypes.data] = _Held(name, nbytes)
        # Every tensor made from ``array`` keeps it alive (torch.from_numpy holds it, views share
        # its storage): the finalizer runs, on whichever thread drops the last one, once none is.
        weakref.finalize(array, self._post_return_slot, array.ctypes.data, name).atexit = False
        return array

    def _post_return_slot(self, address: int, name: str) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._return_slot, address, name)

    def _return_slot(self, address: int, name: str) -> None:
        held = self._held.get(address)
        if held is not None and held.name == name:
            del self._held[address]
        relay = self._relay()
        if relay is not None:
            relay.return_slot(name)

    def plan(self, tensors: Mapping[str, torch.Tensor]) -> LendPlan | str | None:
        """How to send ``tensors`` by reference: the contiguous views of one held slot go by their
        offsets, the few other tensors (at most 16 KiB in all) inside the header.

        None when none of them is in a held slot; otherwise the plan, or why there is none (a text
        for the trace: the tensors are then copied).
        """
        from omni_trio.comm.packing import pack_tensors

        if not tensors or not self._held:
            return None
        slot: _Held | None = None
        base = 0
        in_slot: dict[str, torch.Tensor] = {}
        extras: dict[str, torch.Tensor] = {}
        for path, tensor in tensors.items():
            address = tensor.untyped_storage().data_ptr() if tensor.device.type == "cpu" else 0
            held = self._held.get(address)
            if held is None:
                extras[path] = tensor
            elif slot is not None and held is not slot:
                return "the object carries views of two ot.empty tensors"
            else:
                slot, base = held, address
                in_slot[path] = tensor
        if slot is None:
            return None
        if any(t.device.type != "cpu" for t in extras.values()):
            return "the object carries accelerator tensors beside the ot.empty tensor"
        # Bounded by their storages: pickling a tensor writes its whole storage, not just its view.
        if sum(t.untyped_storage().nbytes() for t in extras.values()) > INLINE_LIMIT:
            return "the object carries more than 16 KiB of other tensors beside the ot.empty tensor"
        if not all(t.is_contiguous() for t in in_slot.values()):
            return "a view of the ot.empty tensor is not contiguous"
        _, packed = pack_tensors(in_slot)  # the dtype and layout checks; the offsets are the slot's
        entries: list[TensorEntry] = []
        for entry, tensor in zip(packed, in_slot.values(), strict=True):
            offset = tensor.data_ptr() - base
            if offset % tensor.element_size() or offset + entry.size > slot.nbytes:
                return "a view of the ot.empty tensor is misaligned"
            entries.append(attrs.evolve(entry, offset=offset))
        return LendPlan(slot.name, entries, max(1, *(e.offset + e.size for e in entries)), extras)

    async def lend(self, target: str, tensors: Mapping[str, torch.Tensor]) -> tuple[ShmPut, LendPlan] | None:
        """Send ``tensors`` to ``target`` by reference when :meth:`plan` allows and the slot is not lent already.

        Returns the relay's put with the plan (settled and released like any pooled put); None: copy
        the tensors instead. Waits for a credit of ``target``.
        """
        plan = self.plan(tensors)
        if plan is None:
            return None
        put = None
        if isinstance(plan, LendPlan):
            relay = self._relay()
            put = None if relay is None else await relay.lend(plan.name, target, plan.length)
        if put is None:
            if self._tracer.enabled:
                reason = plan if isinstance(plan, str) else "the slot is lent to another receiver still"
                nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
                self._tracer.event(
                    "zero_copy_fallback", stage=self._stage, to_stage=target, bytes=nbytes, reason=reason
                )
            return None
        assert isinstance(plan, LendPlan)
        self.sent_by_reference += 1
        if self._tracer.enabled:
            self._tracer.event(
                "zero_copy_send",
                stage=self._stage,
                to_stage=target,
                shm_name=plan.name,
                bytes=sum(e.size for e in plan.entries),
            )
        return put, plan


@contextlib.contextmanager
def allocating(allocator: SlotAllocator | None) -> Iterator[None]:
    """Within: :func:`empty` in this thread (and its copies of this context) uses ``allocator``."""
    token = _CURRENT.set(allocator)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def _shape(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and not isinstance(size[0], int):
        return tuple(int(d) for d in size[0])
    return tuple(int(d) for d in size)


def empty(*size: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised CPU tensor, like ``torch.empty(*size, dtype=dtype)``, that crosses processes without a copy.

    Inside a stage's compute, a tensor of more than 16 KiB lives in a slot of the stage's
    shared-memory pool: sent to a stage in another process (as, or inside, the stage's result),
    only a reference travels. Elsewhere it is ``torch.empty``. Fill it in place (``out=``,
    ``copy_``, indexing); after sending it, read it if you like but do not write to it.
    """
    import torch

    shape = _shape(size)
    chosen = torch.get_default_dtype() if dtype is None else dtype
    allocator = _CURRENT.get()
    if allocator is None:
        return torch.empty(shape, dtype=chosen)
    return allocator.empty(shape, chosen)


def empty_like(tensor: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """:func:`empty` with ``tensor``'s shape (and dtype, unless given); contiguous, on the CPU."""
    return empty(tuple(tensor.shape), dtype=tensor.dtype if dtype is None else dtype)
