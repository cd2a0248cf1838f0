"""The sender's pool of reusable shared-memory slots (:class:`SlotPool`).

Each relay (one per sending stage, :mod:`omni_trio.comm.shm`) keeps a pool of
segments in power-of-two size classes (:func:`slot_size`, from
``MIN_SLOT_BYTES``), created on demand with their pages reserved and mapped
up front (``posix_fallocate`` + ``MAP_POPULATE``), bounded by ``pool_bytes``
in all, and reused across transfers. The sender fills a free slot through its
own long-lived mapping (no page faults, no segment creation); the receiver
keeps its own mapping (:mod:`omni_trio.comm.slotcache`).

A slot is lent out per transfer under a fresh ``lease`` number; it goes back
to the pool only when both the receiver's ACK said the read succeeded
(:meth:`SlotPool.settle`) and the receiver said that no tensor views the slot
any more (:meth:`SlotPool.release`, in whichever order they arrive). A failed
or missing ACK *retires* the slot: it is unlinked and forgotten (a receiver
that still maps it keeps valid memory; POSIX unlinks while mapped are fine),
so a slot the sender writes again is never one a receiver may still be
reading. A stage may also build its output in a slot it holds
(:meth:`SlotPool.borrow_slot`, for :mod:`omni_trio.comm.alloc`) and send it as it is
(:meth:`SlotPool.lend`).

Credits are the relay's, not the pool's: :meth:`SlotPool.lend` only waits on
the one it is handed.
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
from collections.abc import Callable, Iterator

import attrs
import trio

from omni_trio.comm.segments import OFF_THREAD_BYTES, SHM_DIR, Identity, ShmError, create_mapped, unlink_own

__all__ = ["DEFAULT_POOL_BYTES", "MIN_SLOT_BYTES", "Slot", "SlotPool", "slot_size"]

#: Default bytes of pooled slots per relay (per sending stage), lent slots included.
DEFAULT_POOL_BYTES = 256 * 1024 * 1024
#: The smallest pooled slot (smaller transfers use one of this size).
MIN_SLOT_BYTES = 64 * 1024


def slot_size(nbytes: int) -> int:
    """The pooled slot size class of a transfer of ``nbytes``: a power of two, at least MIN_SLOT_BYTES."""
    return max(MIN_SLOT_BYTES, 1 << max(nbytes - 1, 0).bit_length())


def _create_slot(path: str, size: int) -> tuple[mmap.mmap, Identity]:
    # MAP_POPULATE: the page tables are filled now, once, so that no fill of
    # this slot ever takes a page fault.
    return create_mapped(path, size, mmap.MAP_SHARED | mmap.MAP_POPULATE)


def _fill_slot(mm: mmap.mmap, size: int, fill: Callable[[memoryview], None], name: str) -> None:
    """Run ``fill`` on the first ``size`` bytes of a slot's long-lived mapping.

    The mapping stays open (it is the pool's), so an escaped view would not
    dangle, but it would let the sender write into a slot lent to a receiver:
    a view that ``fill`` kept (as counted references to the memoryview it got,
    e.g. a ``torch.frombuffer`` tensor) raises BufferError.
    """
    with memoryview(mm) as whole:
        view = whole[:size]
        baseline = sys.getrefcount(view)
        fill(view)
        escaped = sys.getrefcount(view) > baseline
        if not escaped:
            view.release()
    if escaped:
        raise BufferError(
            f"a view of shared-memory slot {name} outlived its fill callback; drop every view "
            "(e.g. torch.frombuffer tensors) before returning"
        )


@attrs.define(eq=False)
class Slot:
    """One pooled segment and the sender's mapping of it."""

    name: str
    size: int
    mm: mmap.mmap
    identity: Identity
    #: Lent out (being filled, or waiting for its ACK and its release).
    busy: bool = False
    lease: int = -1
    target: str = ""
    acked: bool = False
    released: bool = False
    #: When it was last taken (for evicting the least recently used free slot).
    used: int = 0
    #: A stage's tensor views it (:meth:`SlotPool.borrow_slot`): out of the pool until :meth:`SlotPool.return_slot`.
    held: bool = False


class SlotPool:
    """A relay's pooled slots, named ``<prefix>-p<n>``, at most ``pool_bytes`` in all (0: no pooling).

    ``numbers`` is the relay's name counter, shared with its one-shot
    segments, so that no name is ever used twice. A transfer is pooled when
    its slot (:func:`slot_size`) is at most ``pool_bytes // 2`` and the pool
    has or can make a free slot of that size (evicting free slots of other
    sizes); otherwise the caller falls back to a one-shot segment. Use it from
    one trio thread.
    """

    def __init__(self, prefix: str, pool_bytes: int, numbers: Iterator[int]) -> None:
        self.prefix = prefix
        self.pool_bytes = pool_bytes
        self._numbers = numbers
        self._leases = itertools.count()
        self._uses = itertools.count()
        # name -> slot, every pooled segment that exists; bytes counts them
        # and the slots being created.
        self._slots: dict[str, Slot] = {}
        self._pooled_bytes = 0
        self._closed = False

    async def put(self, target: str, size: int, fill: Callable[[memoryview], None]) -> Slot | None:
        """Fill a free slot with ``size`` bytes (``fill``) and lend it to ``target``; None: no slot, use a one-shot.

        The returned slot carries the transfer's ``lease``. ``fill`` runs in a
        worker thread from ``OFF_THREAD_BYTES``. On failure the slot returns
        to the pool, or is retired if ``fill`` kept a view.
        """
        slot = await self._take(size)
        if slot is None:
            return None
        try:
            if size >= OFF_THREAD_BYTES:
                await trio.to_thread.run_sync(_fill_slot, slot.mm, size, fill, slot.name)
            else:
                _fill_slot(slot.mm, size, fill, slot.name)
        except BufferError:
            self._retire(slot)  # the fill kept a view: never lend this slot again
            raise
        except BaseException:
            self._free(slot)
            raise
        if self._closed:  # closed while a worker thread filled it
            self._retire(slot)
            raise trio.ClosedResourceError("shm relay is closed")
        slot.lease = next(self._leases)
        slot.target = target
        slot.acked = slot.released = False
        return slot

    async def _take(self, size: int) -> Slot | None:
        """A free pooled slot for ``size`` bytes, marked busy; None: use a one-shot segment."""
        wanted = slot_size(size)
        if wanted > self.pool_bytes // 2:
            return None
        free = [s for s in self._slots.values() if not s.busy]
        for slot in free:
            if slot.size == wanted:
                slot.busy = True
                slot.used = next(self._uses)
                return slot
        # Make room for a new slot by evicting free slots of other sizes, oldest first.
        free.sort(key=lambda s: s.used)
        while self._pooled_bytes + wanted > self.pool_bytes and free:
            self._retire(free.pop(0))
        if self._pooled_bytes + wanted > self.pool_bytes:
            return None  # the pool is lent out: fall back
        self._pooled_bytes += wanted  # reserved while the slot is created
        name = f"{self.prefix}-p{next(self._numbers)}"
        path = os.path.join(SHM_DIR, name)
        try:
            if wanted >= OFF_THREAD_BYTES:
                mm, identity = await trio.to_thread.run_sync(_create_slot, path, wanted)
            else:
                mm, identity = _create_slot(path, wanted)
        except ShmError:
            self._pooled_bytes -= wanted
            return None  # /dev/shm is full, or the name is taken: a one-shot segment may still fit
        except BaseException:
            self._pooled_bytes -= wanted  # a failed creation removed its own file
            raise
        if self._closed:
            self._pooled_bytes -= wanted
            unlink_own(path, identity)
            raise trio.ClosedResourceError("shm relay is closed")
        slot = Slot(name=name, size=wanted, mm=mm, identity=identity, busy=True, used=next(self._uses))
        self._slots[name] = slot
        return slot

    def _free(self, slot: Slot) -> None:
        """Back to the pool: no receiver reads the slot now (nor the sender, unless it still holds it)."""
        slot.busy = slot.held
        slot.lease = -1
        slot.target = ""

    def _retire(self, slot: Slot) -> None:
        """Forget and unlink a slot; a receiver still mapping it keeps valid memory."""
        if self._slots.pop(slot.name, None) is None:
            return
        self._pooled_bytes -= slot.size
        unlink_own(os.path.join(SHM_DIR, slot.name), slot.identity)
        # The mapping is not closed explicitly: dropping the last reference
        # unmaps it, unless a view a fill leaked still holds it.
        slot.busy = True

    def settle(self, name: str, lease: int, success: bool) -> None:
        """The ACK of slot ``name``'s transfer under ``lease``: a success marks it read, a failure retires it.

        A slot the receiver released already returns to the pool either way
        (no receiver views it); a failure otherwise retires it, since the
        receiver may or may not hold views of it. A lease the slot no longer
        carries is ignored.
        """
        slot = self._slots.get(name)
        if slot is not None and slot.busy and slot.lease == lease:
            if slot.released:
                self._free(slot)
            elif success:
                slot.acked = True
            else:
                self._retire(slot)

    def release(self, name: str, lease: int, receiver: str) -> bool:
        """The receiver ``receiver`` no longer views slot ``name`` of ``lease``: the slot may be reused.

        Returns the slot to the pool if its transfer was ACKed already, else
        remembers the release for :meth:`settle`. Ignored (returns False) for
        an unknown slot, a lease the slot does not carry any more, another
        receiver, or a repeated release.
        """
        slot = self._slots.get(name)
        if slot is None or not slot.busy or slot.lease != lease or slot.target != receiver or slot.released:
            return False
        slot.released = True
        if slot.acked:
            self._free(slot)
        return True

    async def borrow_slot(self, nbytes: int) -> tuple[str, mmap.mmap] | None:
        """Take a slot of at least ``nbytes`` for the sender to build its output in; None: no room.

        The slot stays out of the pool until :meth:`return_slot`; :meth:`lend` sends it without a copy.
        Returns its name and the pool's mapping of it.
        """
        slot = await self._take(max(nbytes, 1))
        if slot is None:
            return None
        slot.held = True
        return slot.name, slot.mm

    def return_slot(self, name: str) -> None:
        """The sender no longer views held slot ``name``: it returns to the pool once no receiver does either."""
        slot = self._slots.get(name)
        if slot is None or not slot.held:
            return
        slot.held = False
        if slot.lease == -1:
            self._free(slot)

    async def lend(self, name: str, target: str, length: int, credit: trio.Semaphore) -> Slot | None:
        """Lend the first ``length`` bytes of held slot ``name`` to ``target`` once ``credit`` is acquired.

        The returned slot carries the transfer's ``lease``. None (``credit``
        not taken) when the slot is not held or is lent already (a second send
        of the same tensor while the first receiver may still view it).
        """
        slot = self._slots.get(name)
        if slot is None or not slot.held or slot.lease != -1 or not 1 <= length <= slot.size:
            return None
        # Marked before waiting for the credit, so a concurrent lend of the same slot copies instead.
        slot.lease = lease = next(self._leases)
        slot.target = target
        try:
            await credit.acquire()
        except BaseException:
            if self._slots.get(name) is slot and slot.lease == lease:
                self._free(slot)  # back to held (or to the pool, if the sender let go meanwhile)
            raise
        if self._closed or self._slots.get(name) is not slot or slot.lease != lease:
            credit.release()
            raise trio.ClosedResourceError("shm relay is closed")
        slot.acked = slot.released = False
        return slot

    def stats(self) -> dict[str, int]:
        """The pool right now: ``slots``, ``free``, ``lent`` (not free) and ``bytes`` (all slots)."""
        free = sum(1 for s in self._slots.values() if not s.busy)
        return {"slots": len(self._slots), "free": free, "lent": len(self._slots) - free, "bytes": self._pooled_bytes}

    def names(self) -> list[str]:
        """The names of every pooled segment that exists."""
        return list(self._slots)

    def close(self) -> None:
        """Unlink every slot and make no more. Idempotent."""
        self._closed = True
        for slot in list(self._slots.values()):
            self._retire(slot)
