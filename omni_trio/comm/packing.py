"""Byte packing for the data plane: a payload's tensors as one flat buffer.

The tensors that :func:`~omni_trio.comm.tensor_walk.extract_tensors` found
travel as one byte buffer laid out by :func:`pack_runs`: each tensor at an
offset aligned to its element size, consecutive CPU tensors of one dtype and
shape in one :class:`TensorRun` (a stream's small chunks: one torch call
writes or views them all). :func:`write_runs` fills a buffer (an inline
header's bytes, a shared-memory slot), :func:`unpack_runs` views the tensors
in the received one, without a copy; a received layout is checked whole
first (:class:`LayoutError`). A shared-memory DataRef lists one
:class:`TensorEntry` per tensor: :func:`pack_tensors`, :func:`write_packed`
and :func:`unpack_tensors` take that spelling of the same layout.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

from omni_trio.comm.dtypes import SUPPORTED_DTYPES, check_tensor, dtype_from_str
from omni_trio.comm.layout import LayoutError, TensorEntry, TensorRun

__all__ = [
    "LayoutError",
    "TensorEntry",
    "TensorRun",
    "pack_runs",
    "pack_tensors",
    "receiver_device",
    "runs_of",
    "unpack_runs",
    "unpack_tensors",
    "write_packed",
    "write_runs",
]

_CPU = torch.device("cpu")


def pack_runs(tensors: Mapping[str, torch.Tensor]) -> tuple[int, list[TensorRun]]:
    """Compute the packed layout of ``tensors`` (insertion order) as runs.

    Each tensor's offset is aligned to its element size; consecutive CPU tensors of one
    dtype and shape share a :class:`TensorRun` (a stream's small chunks: one torch call writes
    or views them all). Returns the total byte length (at least 1: a transfer always has a
    non-empty buffer) and the runs. No bytes are copied here; see :func:`write_runs`.
    """
    runs: list[TensorRun] = []
    cursor = 0
    paths: list[str] = []
    joinable = False  # whether the open run (paths) may take the next tensor of its dtype and shape
    dtype = device = ""
    shape: tuple[int, ...] = ()
    offset = size = 0
    for path, tensor in tensors.items():
        name = check_tensor(tensor, path, repr)
        tensor_shape = tuple(tensor.shape)
        if joinable and tensor.is_cpu and name == dtype and tensor_shape == shape:
            paths.append(path)
            cursor += size
            continue
        if paths:
            runs.append(TensorRun(tuple(paths), shape, dtype, device, offset, size))
        elem = tensor.element_size()
        offset = -(-cursor // elem) * elem  # round up to a multiple of elem
        size = tensor.numel() * elem
        paths, dtype, shape = [path], name, tensor_shape
        device = "cpu" if tensor.is_cpu else str(tensor.device)
        joinable = device == "cpu" and size > 0
        cursor = offset + size
    if paths:
        runs.append(TensorRun(tuple(paths), shape, dtype, device, offset, size))
    return max(cursor, 1), runs


def pack_tensors(tensors: Mapping[str, torch.Tensor]) -> tuple[int, list[TensorEntry]]:
    """Compute the packed layout of ``tensors`` (insertion order): :func:`pack_runs`, one
    :class:`TensorEntry` per tensor (what a shared-memory DataRef lists)."""
    total, runs = pack_runs(tensors)
    return total, [entry for run in runs for entry in run.entries()]


def runs_of(entries: Iterable[TensorEntry]) -> list[TensorRun]:
    """``entries`` in order, cut into runs that one torch call can write or view: consecutive CPU
    tensors of one dtype and shape, each right after the one before (torch's per-call overhead,
    ~3 µs a tensor, was most of a stream's packing). Any other entry is a run of one."""
    runs: list[TensorRun] = []
    paths: list[str] = []
    first: TensorEntry | None = None
    before: TensorEntry | None = None
    for entry in entries:
        if first is not None and before is not None and _continues(before, entry):
            paths.append(entry.path)
        else:
            if first is not None:
                runs.append(TensorRun(tuple(paths), first.shape, first.dtype, first.device, first.offset, first.size))
            first, paths = entry, [entry.path]
        before = entry
    if first is not None:
        runs.append(TensorRun(tuple(paths), first.shape, first.dtype, first.device, first.offset, first.size))
    return runs


def _continues(before: TensorEntry, entry: TensorEntry) -> bool:
    return (
        entry.size > 0
        and entry.device == "cpu"
        and before.device == "cpu"
        and entry.dtype == before.dtype
        and entry.shape == before.shape
        and entry.offset == before.offset + before.size
    )


def write_packed(
    buffer: memoryview,
    tensors: Mapping[str, torch.Tensor],
    entries: Iterable[TensorEntry],
) -> None:
    """Copy each tensor's bytes into ``buffer`` at its entry's offset (:func:`write_runs`)."""
    write_runs(buffer, tensors, runs_of(entries))


def write_runs(buffer: memoryview, tensors: Mapping[str, torch.Tensor], runs: Iterable[TensorRun]) -> None:
    """Copy each tensor's bytes into ``buffer`` where its run puts it.

    ``buffer`` must be writable and at least as long as the layout (e.g. a
    memoryview of an mmap). Each run's destination is viewed as a tensor of
    its dtype (``torch.frombuffer`` at the run's offset) and filled with one
    ``copy_`` (a run of several tensors with one ``torch.stack``), so
    non-contiguous sources and device-to-host copies need no intermediate
    buffer. All views of ``buffer`` are dropped before returning, so the
    caller can close its mmap right after.
    """
    if buffer.readonly:
        raise ValueError("write_packed needs a writable buffer")
    length = buffer.nbytes
    for run in runs:
        if run.size == 0:
            continue  # torch.frombuffer rejects count=0; nothing to copy anyway
        if run.offset < 0 or run.end > length:
            raise LayoutError(f"tensors {_named(run)} [{run.offset}, {run.end}) do not fit a buffer of {length} bytes")
        dtype = SUPPORTED_DTYPES[run.dtype]
        count = len(run.paths)
        dest = torch.frombuffer(buffer, dtype=dtype, count=run.size // dtype.itemsize * count, offset=run.offset)
        try:
            if count == 1:
                # One small chunk is written while the caches are cold (it comes alone, between idle
                # waits), where each torch call or context manager costs microseconds: a tensor that
                # requires grad is detached only then, and the destination is viewed only if its shape
                # differs (a view, unlike copy_, refuses a tensor that no longer fits the run).
                source = tensors[run.paths[0]]
                if source.requires_grad:
                    source = source.detach()
                (dest if source.shape == dest.shape else dest.view(source.shape)).copy_(source)
            else:
                with torch.no_grad():  # a source that requires grad is copied as data (no detach per tensor)
                    torch.stack([tensors[path] for path in run.paths], out=dest.view(count, *run.shape))
        finally:
            # torch.frombuffer keeps a reference to ``buffer`` but no buffer
            # export: a view surviving this call would let the caller close
            # its mmap under a live tensor. Drop it before returning.
            del dest


def _named(run: TensorRun) -> str:
    """A run's tensors, as an error names them."""
    return repr(run.paths[0]) if len(run.paths) == 1 else f"{run.paths[0]!r}..{run.paths[-1]!r}"


def _byte_source(buffer: memoryview | bytes | bytearray | torch.Tensor) -> tuple[torch.Tensor | memoryview, int]:
    """What the runs are viewed in (a uint8 tensor, or a writable byte memoryview) and its length."""
    if isinstance(buffer, torch.Tensor):
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise LayoutError("a tensor buffer must be a contiguous 1-D uint8 tensor")
        return buffer, buffer.numel()
    view = memoryview(buffer)
    if view.readonly:
        # torch.frombuffer on read-only memory warns and would hand out
        # tensors that must not be written; copy once into owned memory.
        view = memoryview(bytearray(view))
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view, view.nbytes


def _view_run(source: torch.Tensor | memoryview, run: TensorRun, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The tensors of a non-empty, checked run: views of ``source`` (zero-copy)."""
    count = len(run.paths)
    if isinstance(source, torch.Tensor):
        try:
            flat = source[run.offset : run.end].view(dtype)
        except RuntimeError as exc:  # e.g. a caller's uint8 tensor at an odd storage offset
            raise LayoutError(f"tensors {_named(run)}: {exc}") from None
    else:
        # One call straight to the run's typed elements (the tensors keep ``source`` alive).
        flat = torch.frombuffer(source, dtype=dtype, count=(run.end - run.offset) // dtype.itemsize, offset=run.offset)
    if count == 1:
        return (flat if len(run.shape) == 1 else flat.view(run.shape),)
    return flat.view(count, *run.shape).unbind(0)


def receiver_device(source: str, received: torch.device, accelerator: torch.device | None) -> torch.device | None:
    """Where a tensor from ``source`` should end up (None: keep it where it is)."""
    source_type = torch.device(source).type
    if source_type == "cpu" or source_type == received.type:
        return None
    if accelerator is not None:
        return accelerator
    # Source was an accelerator, received on host: move to our own
    # accelerator of that kind if we have one, else keep on CPU.
    if source_type == "cuda" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def unpack_tensors(
    buffer: memoryview | bytes | bytearray | torch.Tensor,
    entries: Iterable[TensorEntry],
    *,
    accelerator: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Rebuild ``{path: tensor}`` from a packed buffer described by ``entries`` (:func:`unpack_runs`)."""
    return unpack_runs(buffer, runs_of(entries), accelerator=accelerator)


def unpack_runs(
    buffer: memoryview | bytes | bytearray | torch.Tensor,
    runs: Iterable[TensorRun],
    *,
    accelerator: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Rebuild ``{path: tensor}`` from a packed buffer.

    The tensors are views of ``buffer`` (a writable memoryview or a uint8
    tensor is used in place; read-only bytes are copied once); a run is one
    typed view and one ``unbind``. Never pass a memoryview of
    an mmap you will close explicitly: torch keeps a reference to the
    memoryview but no buffer export, so the close succeeds and the tensors
    dangle. Copy the mapping into ``torch.empty(n, dtype=torch.uint8)``
    first, or let reference counting own the mapping (see
    :func:`omni_trio.comm.oneshot.read_segment`).

    Device restore: a CPU source stays on CPU; a source of the
    received device type stays; an accelerator source is moved to
    ``accelerator`` (default: this process's current CUDA device when the
    source was CUDA and CUDA is available), otherwise it stays on CPU.

    Raises LayoutError if a run does not fit the buffer or is inconsistent
    (every tensor of it is checked: a run's bounds are those of its last),
    UnsupportedDtype for an unknown dtype.
    """
    source, length = _byte_source(buffer)
    here = source.device if isinstance(source, torch.Tensor) else _CPU  # where the viewed tensors are
    target = torch.device(accelerator) if accelerator is not None else None
    out: dict[str, torch.Tensor] = {}
    for run in runs:
        dtype = _check_run(run, length)
        pieces: Iterable[torch.Tensor]
        if run.size == 0:
            pieces = [torch.empty(run.shape, dtype=dtype, device=here) for _ in run.paths]
        else:
            pieces = _view_run(source, run, dtype)
        if run.device != "cpu":
            try:
                device = receiver_device(run.device, here, target)
            except RuntimeError as exc:  # torch.device() of a malformed device string
                raise LayoutError(f"tensors {_named(run)}: bad device {run.device!r}") from exc
            if device is not None:
                pieces = [piece.to(device) for piece in pieces]
        before = len(out)
        out.update(zip(run.paths, pieces, strict=True))
        if len(out) - before != len(run.paths):
            raise LayoutError(f"duplicate tensor path among {_named(run)}")
    return out


def _check_run(run: TensorRun, length: int) -> torch.dtype:
    """Raise LayoutError unless ``run`` describes tensors inside a buffer of ``length`` bytes; its dtype."""
    if not run.paths:
        raise LayoutError("a tensor run names no tensor")
    dtype = dtype_from_str(run.dtype)
    elem = dtype.itemsize
    if min(run.shape, default=0) < 0:
        raise LayoutError(f"tensors {_named(run)} have a negative dimension {run.shape}")
    if run.size != math.prod(run.shape) * elem:
        raise LayoutError(f"tensors {_named(run)}: size {run.size} != {math.prod(run.shape)} x {elem} bytes")
    if run.offset < 0 or run.offset % elem or run.end > length:
        raise LayoutError(
            f"tensors {_named(run)} [{run.offset}, {run.end}) are misaligned or outside a buffer of {length} bytes"
        )
    return dtype
