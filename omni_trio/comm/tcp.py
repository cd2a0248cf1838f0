"""Tensors to a process on another host: the DataRef over the run's CURVE socket, the bytes on a bulk connection.

Shared memory needs one host. Between hosts (decided by the processes' ``host`` values, see
:mod:`omni_trio.config.processes`), an object too big to go inline travels as a ``tcp`` DataRef: the
tensor-free rest pickled as its header, in the control message (CURVE, and the run's proof), and its
tensors' bytes on a bulk connection of their own (:mod:`omni_trio.comm.bulk`: AES-GCM records,
fetched by the receiver straight into its tensors' buffer).

- Sender: :meth:`TcpCredits.put` offers each tensor's bytes, a memoryview of its own (contiguous,
  CPU) storage, to the process's :class:`~omni_trio.comm.bulk.BulkServer` (a non-contiguous or GPU
  tensor is first made contiguous on the CPU, which copies); the DataRef names the listener and the
  transfer. The offer is held until the transfer settles.
- Receiver: :func:`fetch_tensors` fetches the bytes into one ``torch.empty`` buffer laid out as the
  DataRef's entries say; the tensors are views of it (a CUDA source is moved to this process's CUDA
  device when it has one, as after shared memory).
- Credits: :class:`TcpCredits` bounds the transfers to one target that wait for their ACK, as a shared
  memory relay does (the receiver ACKs a ``tcp`` DataRef once it is fetched); so at most ``credits``
  transfers' bytes are offered to a target at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from omni_trio.comm.bulk import BulkFetcher, BulkServer
from omni_trio.comm.layout import TensorEntry

if TYPE_CHECKING:
    import torch

__all__ = ["TcpCredits", "TcpPut", "bulk_info", "fetch_tensors", "tensor_frame"]


@attrs.frozen(eq=False)
class TcpPut:
    """One transfer to ``target`` holding a credit (and its offer) until its ACK settles it."""

    target: str
    size: int
    transfer: bytes
    #: Where the receiver fetches it: the DataRef's buffer info.
    info: dict[str, Any]


class TcpCredits:
    """Per-target credits of one sending stage's ``tcp`` transfers (the relay interface that
    :class:`~omni_trio.control.transfers.Transfers` settles), and their offers on ``bulk``."""

    def __init__(self, credits_per_target: int, bulk: BulkServer) -> None:
        self._per_target = credits_per_target
        self._bulk = bulk
        self._credits: dict[str, trio.Semaphore] = {}

    def _of(self, target: str) -> trio.Semaphore:
        credits = self._credits.get(target)
        if credits is None:
            credits = self._credits[target] = trio.Semaphore(self._per_target)
        return credits

    async def put(self, target: str, frames: Sequence[memoryview]) -> TcpPut:
        """Take a credit of ``target`` (waits while all are out) and offer ``frames`` (each tensor's bytes)."""
        if self._bulk.address is None:
            raise RuntimeError("this process does not listen over TCP: it has no bulk listener to offer from")
        await self._of(target).acquire()
        transfer = self._bulk.offer(frames)
        host, port = self._bulk.address
        info = {"host": host, "port": port, "transfer": transfer.hex()}
        return TcpPut(target, sum(frame.nbytes for frame in frames), transfer, info)

    def settle(self, put: TcpPut, success: bool, *, keep_credit: bool = False) -> bool:
        """The transfer's ACK came (or never will): withdraw its offer, give its credit back unless the
        receiver keeps it."""
        self._bulk.withdraw(put.transfer)
        if not keep_credit or not success:
            self._of(put.target).release()
        return success

    def return_credit(self, target: str) -> None:
        """Give back a credit that :meth:`settle` kept."""
        self._of(target).release()

    def in_use(self, target: str) -> int:
        """Credits of ``target`` taken now."""
        return self._per_target - self._of(target).value


def tensor_frame(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor`` as a memoryview of its own storage (copied only if it is not a
    contiguous CPU tensor)."""
    import torch

    flat = tensor.detach()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # ndarray is a buffer


def bulk_info(info: dict[str, Any]) -> tuple[tuple[str, int], bytes]:
    """The listener and the transfer id a ``tcp`` buffer's info names (ValueError if it names none)."""
    host, port, transfer = info.get("host"), info.get("port"), info.get("transfer")
    if type(host) is not str or not host or type(port) is not int or not 0 < port < 65536:
        raise ValueError("a tcp buffer's info needs the 'host' and 'port' of a bulk listener")
    if type(transfer) is not str or len(transfer) != 32:
        raise ValueError("a tcp buffer's info needs a 'transfer' id of 32 hex digits")
    return (host, port), bytes.fromhex(transfer)


async def fetch_tensors(
    fetcher: BulkFetcher, info: dict[str, Any], entries: tuple[TensorEntry, ...], size: int
) -> dict[str, torch.Tensor]:
    """The tensors of a ``tcp`` DataRef, fetched into one buffer they are views of."""
    from omni_trio.comm.packing import unpack_tensors

    address, transfer = bulk_info(info)
    buffer = await fetcher.fetch(address, transfer, entries, size)
    return unpack_tensors(buffer, entries)
