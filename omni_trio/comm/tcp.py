"""Tensors to a process on another host: ZMQ frames over the run's CURVE TCP socket.

Shared memory needs one host. Between hosts (decided by the processes' ``host`` values, see
:mod:`omni_trio.config.processes`), an object too big to go inline travels as a ``tcp`` DataRef: the
tensor-free rest pickled as its header, and each tensor's bytes as a frame of the same message.

- Sender: each frame is a memoryview of the tensor's own (contiguous, CPU) storage. pyzmq sends a
  frame of 64 KiB and more without copying it (the frame keeps the tensor alive until libzmq is done);
  a non-contiguous or GPU tensor is first made contiguous on the CPU, which copies.
- Receiver: the codec hands each frame over as the ``bytes`` pyzmq received it into; each tensor is
  built over that buffer (``torch.frombuffer``), with no second copy (a CUDA source is moved to this
  process's CUDA device when it has one, as after shared memory). Nothing else holds those bytes,
  so writing into the tensor is safe, although Python calls ``bytes`` immutable.
- Credits: :class:`TcpCredits` bounds the transfers to one target that wait for their ACK, as a shared
  memory relay does (the receiver ACKs a ``tcp`` DataRef once it is decoded); so at most ``credits``
  transfers' bytes are in flight to a target, whatever the socket buffers hold.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import attrs
import trio

from omni_trio.comm.layout import ELEMENT_SIZES, TensorEntry

if TYPE_CHECKING:
    import torch

__all__ = ["TcpCredits", "TcpPut", "frame_sizes_match", "tensor_frame", "tensors_from_frames"]


@attrs.frozen(eq=False)
class TcpPut:
    """One transfer to ``target`` holding a credit until its ACK settles it."""

    target: str
    size: int


class TcpCredits:
    """Per-target credits of one sending stage's ``tcp`` transfers (the relay interface that
    :class:`~omni_trio.control.transfers.Transfers` settles)."""

    def __init__(self, credits_per_target: int) -> None:
        self._per_target = credits_per_target
        self._credits: dict[str, trio.Semaphore] = {}

    def _of(self, target: str) -> trio.Semaphore:
        credits = self._credits.get(target)
        if credits is None:
            credits = self._credits[target] = trio.Semaphore(self._per_target)
        return credits

    async def put(self, target: str, size: int) -> TcpPut:
        """Take a credit of ``target`` (waits while all are out)."""
        await self._of(target).acquire()
        return TcpPut(target, size)

    def settle(self, put: TcpPut, success: bool, *, keep_credit: bool = False) -> bool:
        """The transfer's ACK came (or never will): give its credit back unless the receiver keeps it."""
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


def tensors_from_frames(entries: tuple[TensorEntry, ...], frames: tuple[bytes, ...]) -> dict[str, torch.Tensor]:
    """The tensors of a ``tcp`` DataRef, built over the received frames (no copy)."""
    import torch

    # The same device restore as a shared-memory transfer's.
    from omni_trio.comm.dtypes import dtype_from_str
    from omni_trio.comm.packing import receiver_device

    tensors: dict[str, Any] = {}
    for entry, frame in zip(entries, frames, strict=True):
        dtype = dtype_from_str(entry.dtype)
        if not frame:
            tensors[entry.path] = torch.empty(entry.shape, dtype=dtype)
            continue
        with warnings.catch_warnings():
            # The frame's bytes belong to this tensor alone (see the module docstring).
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(frame, dtype=torch.uint8)
        tensor = raw.view(dtype).reshape(entry.shape)
        device = receiver_device(entry.device, tensor.device, None)
        tensors[entry.path] = tensor if device is None else tensor.to(device)
    return tensors


def _size(frame: bytes | memoryview) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else len(frame)


def frame_sizes_match(entries: tuple[TensorEntry, ...], frames: tuple[bytes, ...]) -> bool:
    """Whether each frame holds exactly its entry's bytes (checked when a DataRef is parsed)."""
    return len(entries) == len(frames) and all(
        _size(frame) == entry.size == math.prod(entry.shape) * ELEMENT_SIZES.get(entry.dtype, 0)
        for entry, frame in zip(entries, frames, strict=True)
    )
