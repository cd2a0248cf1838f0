"""Shared-memory relay for host memory, Linux ``/dev/shm``: the sender's side.

:class:`ShmRelay` (one per sending stage) carries each transfer in one of two
kinds of segment (their files: :mod:`omni_trio.comm.segments`):

* **pooled slots** (the fast path, :mod:`omni_trio.comm.slotpool`): reusable
  segments the sender fills through its own long-lived mapping and announces
  as ``{"shm_name", "size", "segment_size", "lease"}``; the receiver maps the
  slot once and keeps the mapping (:mod:`omni_trio.comm.slotcache`), builds
  its tensors as views of it, and releases the slot (:meth:`ShmRelay.release`)
  when no tensor views it any more.
* **one-shot segments** (the slow path, :mod:`omni_trio.comm.oneshot`:
  pooling disabled, the transfer is larger than ``pool_bytes // 2``, or the
  pool is full of lent slots): created and filled once, copied out and
  unlinked by the receiver, which then ACKs. The sender's
  :meth:`ShmRelay.settle` removes the segment, on a failed or missing ACK,
  if it still exists.

The ACK settles the credit in both cases (unless the caller keeps it until
the receiver's scheduler has taken the object: ``settle(keep_credit=True)``
then :meth:`ShmRelay.return_credit`): a receiver that keeps a pooled tensor
for a long time holds the slot, never a credit.

Names are ``<prefix>-<n>`` (one-shot) and ``<prefix>-p<n>`` (pooled), with
``n`` from one counter per relay (never reused); :meth:`ShmRelay.aclose`
unlinks every slot, and the supervisor removes what a crash left
(:func:`~omni_trio.comm.segments.remove_segments`).

Back-pressure: each target has its own credits (a ``trio.Semaphore``); a put
waits for a credit of *its* target only, so one slow consumer does not block
the producer's other edges. Each put counts as one transfer
whatever it holds: callers pack a chunk and its metadata tensors into one
buffer.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Callable
from typing import Any

import attrs
import trio

from omni_trio.comm.oneshot import write_segment
from omni_trio.comm.segments import SHM_DIR, Identity, ShmError, check_prefix, unlink_own
from omni_trio.comm.slotpool import SlotPool

__all__ = ["DEFAULT_MAX_TRANSFER_BYTES", "ShmPut", "ShmRelay", "TransferTooLarge"]

#: Default per-transfer limit (the reference's ``slot_size_mb`` default).
DEFAULT_MAX_TRANSFER_BYTES = 512 * 1024 * 1024


class TransferTooLarge(ShmError, ValueError):
    """A transfer exceeds the relay's per-transfer limit (fails the request only)."""


@attrs.frozen
class ShmPut:
    """One outstanding transfer written by :meth:`ShmRelay.put`.

    ``size`` is the transfer's length. A pooled put also has the slot's
    ``segment_size`` (at least ``size``) and its ``lease`` number; a one-shot
    put has neither (its segment is exactly ``size`` bytes).
    """

    name: str
    size: int
    segment_size: int | None = None
    lease: int | None = None
    #: The one-shot segment's file as created: a later cleanup unlinks only that file.
    identity: Identity | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def pooled(self) -> bool:
        """True when the transfer went through a pooled slot."""
        return self.lease is not None

    def info(self) -> dict[str, Any]:
        """The relay's put metadata, carried verbatim in ``DataRef.buffer.info``."""
        info: dict[str, Any] = {"shm_name": self.name, "size": self.size}
        if self.lease is not None:
            info["segment_size"] = self.segment_size
            info["lease"] = self.lease
        return info


class ShmRelay:
    """Sender side of the shared-memory relay, with per-target credits and a slot pool.

    ``prefix`` names every segment (``f"{prefix}-{counter}"``); make it unique
    per relay (``"<run prefix>-<process>-<relay>"``). ``credits_per_target`` is how
    many puts to one target may be outstanding (put but not settled);
    ``max_transfer_bytes`` bounds one transfer; ``pool_bytes`` bounds the
    pooled slots (0, the default here, disables pooling: every transfer is
    one-shot; the endpoint passes ``comm.pool_mb``, by default
    ``DEFAULT_POOL_BYTES``). A transfer is pooled when the pool has a slot
    for it (:class:`~omni_trio.comm.slotpool.SlotPool`); otherwise it falls
    back to a one-shot segment.

    Lifecycle of one transfer: ``put`` → send DataReady with ``put.info()`` →
    the ACK (or its failure/timeout, or the request's abort) → ``settle``;
    for a pooled put, also the receiver's slot release → ``release``, before
    or after the ACK. Every put must be settled exactly once; extra settles
    and unknown or repeated releases are ignored.
    """

    #: Data lives in host memory.
    device = "cpu"

    def __init__(
        self,
        prefix: str,
        *,
        credits_per_target: int = 2,
        max_transfer_bytes: int = DEFAULT_MAX_TRANSFER_BYTES,
        pool_bytes: int = 0,
    ) -> None:
        if credits_per_target < 1:
            raise ValueError("credits_per_target must be at least 1")
        if max_transfer_bytes < 1:
            raise ValueError("max_transfer_bytes must be at least 1")
        if pool_bytes < 0:
            raise ValueError("pool_bytes must be at least 0")
        if not os.path.isdir(SHM_DIR):
            raise ShmError(f"{SHM_DIR} is not available; the shm relay needs Linux POSIX shared memory")
        self.prefix = check_prefix(prefix)
        self.credits_per_target = credits_per_target
        self.max_transfer_bytes = max_transfer_bytes
        self.pool_bytes = pool_bytes
        self._counter = itertools.count()
        self._pool = SlotPool(self.prefix, pool_bytes, self._counter)
        self._credits: dict[str, trio.Semaphore] = {}
        # name -> (target, put); insertion order = put order.
        self._outstanding: dict[str, tuple[str, ShmPut]] = {}
        self._closed = False

    def _semaphore(self, target: str) -> trio.Semaphore:
        sem = self._credits.get(target)
        if sem is None:
            sem = self._credits[target] = trio.Semaphore(self.credits_per_target)
        return sem

    def _next_name(self) -> str:
        return f"{self.prefix}-{next(self._counter)}"

    async def put(self, target: str, nbytes: int, fill: Callable[[memoryview], None]) -> ShmPut:
        """Take a credit of ``target``, then a pooled slot (or a new segment) of ``nbytes``, and fill it.

        ``fill`` receives a writable memoryview of exactly ``nbytes`` (at
        least 1) and must not keep views of it. It runs in a worker thread when
        the transfer is at least ``OFF_THREAD_BYTES`` (so it must not touch
        trio). A zero-byte transfer gets a 1-byte segment. Waits while
        ``target`` has no free credit. Raises TransferTooLarge when ``nbytes``
        exceeds ``max_transfer_bytes``. On any failure (including
        cancellation) the credit is returned, a one-shot segment removed, and
        a slot returned to the pool (or retired if ``fill`` kept a view).
        """
        if self._closed:
            raise trio.ClosedResourceError("shm relay is closed")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"invalid transfer size {nbytes!r}")
        if nbytes > self.max_transfer_bytes:
            raise TransferTooLarge(
                f"transfer of {nbytes} bytes exceeds the shared-memory relay limit of "
                f"{self.max_transfer_bytes} bytes (max_transfer_bytes)"
            )
        size = max(nbytes, 1)
        sem = self._semaphore(target)
        await sem.acquire()
        try:
            if self._closed:
                raise trio.ClosedResourceError("shm relay is closed")
            slot = await self._pool.put(target, size, fill)
            if slot is not None:
                put = ShmPut(name=slot.name, size=size, segment_size=slot.size, lease=slot.lease)
            else:
                name = self._next_name()
                identity = await write_segment(os.path.join(SHM_DIR, name), size, fill)
                put = ShmPut(name=name, size=size, identity=identity)
        except BaseException:
            sem.release()
            raise
        # No checkpoint between the fill and this registration: a put that
        # returned is always tracked, so settle/aclose can clean it up.
        self._outstanding[put.name] = (target, put)
        return put

    def settle(self, put: ShmPut, success: bool, *, keep_credit: bool = False) -> bool:
        """Finish a transfer as its ACK says: return its credit; clean up on failure.

        Call it when the receiver's ACK arrives (``success`` as ACKed), or
        with ``success=False`` on ACK timeout or the request's abort. With
        ``keep_credit`` (a successful ACK whose receiver has yet to consume
        the object) the credit stays taken: hand it back later with
        :meth:`return_credit`. Returns whether this call settled the put.

        One-shot: after a successful ACK the receiver has already unlinked the
        segment; we unlink again anyway (a no-op then) so that a receiver that
        ACKed without reading cannot leak it. After a failure it is ours to
        remove. Pooled: a success marks the slot read; it returns to the pool
        once released too (:meth:`release`). A failure retires the slot
        (unless the receiver already released it), since the receiver may or
        may not hold views of it. Idempotent (a settle of an older put of the
        same slot is ignored).
        """
        entry = self._outstanding.get(put.name)
        if entry is None or entry[1] != put:
            return False
        del self._outstanding[put.name]
        target, _ = entry
        if put.lease is None:  # one-shot
            # Names are never reused, and only the file we created goes: a name
            # the receiver freed and someone planted again is left alone.
            unlink_own(os.path.join(SHM_DIR, put.name), put.identity)
        else:
            self._pool.settle(put.name, put.lease, success)
        if not (keep_credit and success):
            self._credits[target].release()
        return True

    def return_credit(self, target: str) -> None:
        """Give back a credit of ``target`` that :meth:`settle` kept (``keep_credit``); once per kept credit."""
        self._credits[target].release()

    def release(self, name: str, lease: int, receiver: str) -> bool:
        """The receiver ``receiver`` no longer views slot ``name`` of ``lease``: the slot may be reused.

        Returns the slot to the pool if its transfer was ACKed already, else
        remembers the release for :meth:`settle`. Ignored (returns False) for
        an unknown slot, a lease the slot does not carry any more, another
        receiver, or a repeated release.
        """
        return self._pool.release(name, lease, receiver)

    # ------------------------------------------------ slots a stage writes into (omni_trio.comm.alloc)

    async def borrow_slot(self, nbytes: int) -> tuple[str, mmap.mmap] | None:
        """Take a pooled slot of at least ``nbytes`` for the sender to build its output in; None: no room.

        The slot stays out of the pool until :meth:`return_slot`; :meth:`lend` sends it without a copy.
        Returns its name and the relay's mapping of it.
        """
        if self._closed or nbytes > self.max_transfer_bytes:
            return None
        return await self._pool.borrow_slot(nbytes)

    def return_slot(self, name: str) -> None:
        """The sender no longer views held slot ``name``: it returns to the pool once no receiver does either."""
        self._pool.return_slot(name)

    async def lend(self, name: str, target: str, length: int) -> ShmPut | None:
        """Send the first ``length`` bytes of held slot ``name`` to ``target`` as they are (no copy).

        Takes a credit of ``target`` like :meth:`put`, and the put is settled and released the same
        way. None (nothing taken) when the slot is not held or is lent already (a second send of the
        same tensor while the first receiver may still view it): the caller copies instead.
        """
        slot = await self._pool.lend(name, target, length, self._semaphore(target))
        if slot is None:
            return None
        put = ShmPut(name=name, size=length, segment_size=slot.size, lease=slot.lease)
        self._outstanding[name] = (target, put)
        return put

    def in_use(self, target: str | None = None) -> int:
        """Outstanding (put, not settled) transfers, across targets or for one."""
        if target is None:
            return len(self._outstanding)
        return sum(1 for t, _ in self._outstanding.values() if t == target)

    def outstanding(self) -> list[ShmPut]:
        """The puts not settled yet, oldest first."""
        return [put for _, put in self._outstanding.values()]

    def pool_stats(self) -> dict[str, int]:
        """The pool right now: ``slots``, ``free``, ``lent`` (not free) and ``bytes`` (all slots)."""
        return self._pool.stats()

    def slot_names(self) -> list[str]:
        """The names of every pooled segment that exists."""
        return self._pool.names()

    async def aclose(self) -> None:
        """Settle every outstanding put as failed, unlink every slot, refuse further puts. Idempotent."""
        self._closed = True
        for put in self.outstanding():
            self.settle(put, False)
        self._pool.close()
        await trio.lowlevel.checkpoint()

    async def __aenter__(self) -> ShmRelay:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
