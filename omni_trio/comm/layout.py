"""The torch-free description of packed tensors, shared by sender and receiver, and its error.

Kept apart from :mod:`omni_trio.comm.packing` so that control-plane code
(DataRef validation) never imports torch: a worker whose stages never touch
a tensor starts without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from omni_trio.errors import OmniTrioError

#: Bytes per element of each dtype that may cross the data plane, keyed by
#: ``str(dtype)`` (the wire form, ``"torch.float32"``).
ELEMENT_SIZES: dict[str, int] = {
    "torch.bool": 1,
    "torch.uint8": 1,
    "torch.int8": 1,
    "torch.int16": 2,
    "torch.int32": 4,
    "torch.int64": 8,
    "torch.float16": 2,
    "torch.bfloat16": 2,
    "torch.float32": 4,
    "torch.float64": 8,
    "torch.complex64": 8,
    "torch.complex128": 16,
}


class LayoutError(OmniTrioError, ValueError):
    """A packed layout does not fit its buffer or is inconsistent.

    Raised on the receiving side (bad or hostile metadata); the stage turns it
    into a failure ACK for that transfer.
    """


def _shape_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


@attrs.frozen
class TensorEntry:
    """Where one tensor lives in a packed buffer.

    ``device`` is the *source* device string (``"cpu"``, ``"cuda:0"``);
    ``offset`` and ``size`` are in bytes.
    """

    path: str
    shape: tuple[int, ...] = attrs.field(converter=_shape_tuple)
    dtype: str
    device: str
    offset: int
    size: int

    def __reduce__(self) -> tuple[type[TensorEntry], tuple[str, tuple[int, ...], str, str, int, int]]:
        # Pickled with every small inline chunk: its fields as a tuple cost a third of attrs' state dict.
        return (TensorEntry, (self.path, self.shape, self.dtype, self.device, self.offset, self.size))


@attrs.frozen
class TensorRun:
    """Tensors of one shape, dtype and device packed back to back: the ``i``-th of ``paths`` lives at
    ``offset + i * size`` (``size``: the bytes of each).

    The layout as the packing code works with it, and as an inline header carries it: a stream's
    small chunks are one run, where a :class:`TensorEntry` each would cost an object per chunk to
    build, pickle, unpickle and check. A single tensor is a run of one.
    """

    paths: tuple[str, ...]
    shape: tuple[int, ...] = attrs.field(converter=_shape_tuple)
    dtype: str
    device: str
    offset: int
    size: int

    def __reduce__(self) -> tuple[type[TensorRun], tuple[tuple[str, ...], tuple[int, ...], str, str, int, int]]:
        return (TensorRun, (self.paths, self.shape, self.dtype, self.device, self.offset, self.size))

    @property
    def end(self) -> int:
        """The offset just past the run's last byte."""
        return self.offset + self.size * len(self.paths)

    def entries(self) -> list[TensorEntry]:
        """One :class:`TensorEntry` per tensor of the run (what a shared-memory DataRef lists)."""
        return [
            TensorEntry(path, self.shape, self.dtype, self.device, self.offset + i * self.size, self.size)
            for i, path in enumerate(self.paths)
        ]


@attrs.frozen
class ChunkRun:
    """A stream's run of chunks as an inline header carries it (:mod:`omni_trio.comm.chunk_runs`).

    The chunks' tensors, all of one dtype (``str(dtype)``) and ``shape``, lie back to back in
    ``data``; ``metadata`` is each chunk's metadata when the run was of ``(tensor, metadata)`` pairs,
    None when it was of bare tensors. Torch-free, like the rest of this module: a receiver tells the
    header apart before it needs torch.
    """

    dtype: str
    shape: tuple[int, ...]
    metadata: list[Any] | None
    data: bytearray

    def __reduce__(self) -> tuple[type[ChunkRun], tuple[str, tuple[int, ...], list[Any] | None, bytearray]]:
        return (ChunkRun, (self.dtype, self.shape, self.metadata, self.data))
