"""Tensor extraction and byte packing for the data plane (SPEC §8.5).

A payload crosses processes as two parts:

* a *header*: the payload object with every tensor replaced by a
  :class:`TensorPlaceholder` (the caller pickles it);
* one flat byte buffer holding every tensor's bytes, described by a list of
  :class:`TensorEntry` (path, shape, dtype, source device, offset, size).

[FIX] (SPEC §9 item 20): the reference keyed tensors by a path built from
user keys (``parent.key``/``parent[i]``), so a key containing ``.`` or
``[0]`` could map two tensors to one path, and a user dict with a
``"_tensor_placeholder"`` key was mis-restored as a tensor. Here every
tensor gets a path from a counter (``"t0"``, ``"t1"``, ...) and the
placeholder is a dedicated class, so neither can collide with user data.
Namedtuples are rebuilt with ``_make``.

What is walked: ``dict`` (values), ``list`` and ``tuple`` (including
namedtuples and their subclasses). Sets are left alone (tensors hash by
identity, a set of tensors has no meaningful order to restore). Tensors held
inside other objects (attrs/dataclass instances, custom classes) are *not*
extracted: they stay inside the pickled header (pickle copies them through
the control plane, which is correct but slower). Containers without tensors
are returned as they are (no copy).

Dtypes are checked at the sender ([FIX] SPEC §9 item 21): an unsupported
dtype raises :class:`UnsupportedDtype` naming the tensor's location.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from omni_trio.comm.layout import ELEMENT_SIZES, TensorEntry, TensorRun
from omni_trio.errors import OmniTrioError

__all__ = [
    "SUPPORTED_DTYPES",
    "LayoutError",
    "TensorEntry",
    "TensorPlaceholder",
    "TensorRun",
    "UnsupportedDtype",
    "UnsupportedTensor",
    "dtype_from_str",
    "extract_tensors",
    "pack_runs",
    "pack_tensors",
    "restore",
    "runs_of",
    "tensor_nbytes",
    "tensor_path",
    "unpack_runs",
    "unpack_tensors",
    "write_packed",
    "write_runs",
]

#: Dtypes that may cross the data plane, keyed by ``str(dtype)`` (the form
#: used on the wire, e.g. ``"torch.float32"``). ``name in SUPPORTED_DTYPES``
#: tests a wire string; ``SUPPORTED_DTYPES[name]`` gives the torch dtype.
SUPPORTED_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {name: getattr(torch, name.removeprefix("torch.")) for name in ELEMENT_SIZES}
)


class UnsupportedTensor(OmniTrioError, TypeError):
    """A tensor that cannot be sent through the data plane (sender-side check)."""


class UnsupportedDtype(UnsupportedTensor):
    """A tensor's dtype is not in :data:`SUPPORTED_DTYPES`."""


class LayoutError(OmniTrioError, ValueError):
    """A packed layout does not fit its buffer or is inconsistent.

    Raised on the receiving side (bad or hostile metadata); the stage turns it
    into a failure ACK for that transfer.
    """


def dtype_from_str(name: str) -> torch.dtype:
    """Return the torch dtype for a wire dtype string, or raise UnsupportedDtype."""
    try:
        return SUPPORTED_DTYPES[name]
    except KeyError:
        raise UnsupportedDtype(f"unsupported tensor dtype {name!r}") from None


def tensor_path(index: int) -> str:
    """The path (dict key, TensorEntry.path) of the ``index``-th extracted tensor."""
    return f"t{index}"


@attrs.frozen
class TensorPlaceholder:
    """Stands in for an extracted tensor inside the header: the ``index``-th tensor found.

    A dedicated class (not a dict) so that user data can never be mistaken for
    a placeholder. Picklable: the receiver imports this module anyway. Its shape,
    dtype and device are the layout's (:class:`TensorRun`), not repeated here.
    """

    index: int

    @property
    def path(self) -> str:
        """The key of this tensor in the ``{path: tensor}`` mapping."""
        return tensor_path(self.index)

    def __reduce__(self) -> tuple[type[TensorPlaceholder], tuple[int]]:
        # Pickled with every small chunk: its field as a tuple costs a fraction of attrs' state dict.
        return (TensorPlaceholder, (self.index,))


#: Where a node sits in a walked object: ``(parent's path, key)``, None for the root. Formatted
#: (:func:`describe_path`) only to word an error: formatting costs more than the walk itself.
Path = tuple[Any, object] | None


def describe_path(path: Path) -> str:
    """``<root>[0]['pcm']``: the place a :data:`Path` stands for."""
    keys: list[object] = []
    while path is not None:
        path, key = path
        keys.append(key)
    return "<root>" + "".join(f"[{key!r}]" for key in reversed(keys))


#: ``str(dtype)`` of each supported dtype, keyed by the dtype itself: a dict lookup per tensor.
_DTYPE_NAMES: Mapping[torch.dtype, str] = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}

_CPU = torch.device("cpu")


def _check_tensor(tensor: torch.Tensor, place: Any, describe: Callable[[Any], str]) -> str:
    """Validate a tensor for the data plane; return its dtype string. ``describe(place)`` words its
    place in an error (called only then: one small call per tensor, no closure built for it)."""
    name = _DTYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise UnsupportedDtype(
            f"tensor at {describe(place)} has unsupported dtype {tensor.dtype}; "
            f"supported: {', '.join(sorted(SUPPORTED_DTYPES))}"
        )
    # Sparse/mkldnn/nested tensors have no single strided byte image to copy.
    if tensor.layout is not torch.strided or tensor.is_nested:
        raise UnsupportedTensor(f"tensor at {describe(place)} has unsupported layout {tensor.layout}")
    if tensor.is_meta:
        raise UnsupportedTensor(f"tensor at {describe(place)} is on the meta device (it has no data)")
    return name


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields") and hasattr(type(obj), "_make")


def _rebuild_dict(original: dict[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    if type(original) is dict:
        return dict(items)
    # Subclasses (OrderedDict, defaultdict, custom): a shallow copy keeps
    # their extra state (default_factory, attributes); then refill in order.
    new = copy.copy(original)
    new.clear()
    new.update(items)
    return new


def _rebuild_list(original: list[Any], items: list[Any]) -> list[Any]:
    if type(original) is list:
        return items
    new = copy.copy(original)
    new[:] = items
    return new


def _rebuild_tuple(original: tuple[Any, ...], items: list[Any]) -> tuple[Any, ...]:
    if type(original) is tuple:
        return tuple(items)
    if _is_namedtuple(original):
        # namedtuple(*fields) would fail with tuple(items); _make is the API.
        rebuilt: tuple[Any, ...] = type(original)._make(items)  # type: ignore[attr-defined]
        return rebuilt
    # Other tuple subclasses (torch.return_types structseqs, ...) take an iterable.
    return type(original)(items)


#: Types that hold no tensor (nor placeholder): :func:`tensor_nbytes` and the container walk
#: pass them by before any ``isinstance`` check or call.
_LEAVES = frozenset({str, bytes, int, float, bool, type(None)})


def _map_containers(
    obj: object,
    leaf: Callable[[object, Path], object],
) -> object:
    """Walk dicts/lists/tuples, applying ``leaf`` to everything else.

    Containers are rebuilt only when something inside changed (identity
    comparison), so tensor-free data is returned without copying. ``leaf``
    receives the node's :data:`Path`, for error messages; it is not called for
    a :data:`_LEAVES` value inside a container (it could only return it).
    Cycles raise ValueError instead of recursing forever.
    """
    return _walk(obj, None, leaf, set())


def _walk(node: object, path: Path, leaf: Callable[[object, Path], object], active: set[int]) -> object:
    # A module-level function, not a closure that calls itself: such a closure
    # is a reference cycle (through its own cell) that keeps ``leaf``, and what
    # ``leaf`` captured (restore's received tensors, possibly views of a pooled
    # shared-memory slot), alive until the cyclic garbage collector runs.
    if isinstance(node, dict):
        container_id = id(node)
        if container_id in active:
            raise ValueError(f"cyclic container at {describe_path(path)}")
        active.add(container_id)
        try:
            items: list[tuple[Any, Any]] = []
            changed = False
            for key, value in node.items():
                if type(value) in _LEAVES:
                    items.append((key, value))
                    continue
                if isinstance(value, (dict, list, tuple)):
                    new_value = _walk(value, (path, key), leaf, active)
                else:
                    new_value = leaf(value, (path, key))  # one call, not a walk that ends in it
                changed = changed or new_value is not value
                items.append((key, new_value))
        finally:
            active.discard(container_id)
        return _rebuild_dict(node, items) if changed else node
    if isinstance(node, (list, tuple)):
        container_id = id(node)
        if container_id in active:
            raise ValueError(f"cyclic container at {describe_path(path)}")
        active.add(container_id)
        try:
            elems: list[Any] = []
            changed = False
            for i, value in enumerate(node):
                if type(value) in _LEAVES:
                    elems.append(value)
                    continue
                if isinstance(value, (dict, list, tuple)):
                    new_value = _walk(value, (path, i), leaf, active)
                else:
                    new_value = leaf(value, (path, i))
                changed = changed or new_value is not value
                elems.append(new_value)
        finally:
            active.discard(container_id)
        if not changed:
            return node
        if isinstance(node, list):
            return _rebuild_list(node, elems)
        return _rebuild_tuple(node, elems)
    return leaf(node, path)


def tensor_nbytes(obj: object) -> int:
    """The bytes of the tensors :func:`extract_tensors` would find in ``obj`` (each tensor once).

    A count only: nothing is rebuilt, no dtype is checked and a container met again (a cycle)
    is not walked twice, so counting what an in-process edge carries costs a fraction of an
    extraction and never fails.
    """
    if type(obj) in _LEAVES:
        return 0
    seen: set[int] = set()
    if isinstance(obj, (dict, list, tuple)):
        return _count_in(obj, seen)
    return _count_in((obj,), seen)


def _count_in(container: dict[Any, Any] | list[Any] | tuple[Any, ...], seen: set[int]) -> int:
    """The bytes of the tensors in ``container`` not in ``seen`` (ids of tensors and containers met)."""
    seen.add(id(container))
    total = 0
    for node in container.values() if isinstance(container, dict) else container:
        if type(node) in _LEAVES or id(node) in seen:
            continue
        if isinstance(node, (dict, list, tuple)):
            if node:  # an empty one is not worth a call
                total += _count_in(node, seen)
        elif isinstance(node, torch.Tensor):
            seen.add(id(node))
            total += node.numel() * node.element_size()
    return total


def extract_tensors(obj: object) -> tuple[object, dict[str, torch.Tensor]]:
    """Replace every tensor in ``obj`` by a :class:`TensorPlaceholder`.

    Returns the rewritten object (``obj`` itself when it holds no tensors;
    the input is never mutated) and ``{path: tensor}`` in discovery order.
    The same tensor object appearing twice is extracted once and restored as
    one object at both places (aliasing survives the trip).

    Raises UnsupportedDtype / UnsupportedTensor for tensors that cannot be
    packed, naming where the tensor was found.
    """
    tensors: dict[str, torch.Tensor] = {}
    by_identity: dict[int, TensorPlaceholder] = {}
    counter = itertools.count()

    def leaf(node: object, path: Path) -> object:
        if not isinstance(node, torch.Tensor):
            return node
        seen = by_identity.get(id(node))
        if seen is not None:
            return seen
        _check_tensor(node, path, describe_path)
        placeholder = TensorPlaceholder(next(counter))
        by_identity[id(node)] = placeholder
        tensors[placeholder.path] = node
        return placeholder

    return _map_containers(obj, leaf), tensors


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
        name = _check_tensor(tensor, path, repr)
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
                # requires grad is detached only then, and the destination is viewed only if it must be.
                source = tensors[run.paths[0]]
                if source.requires_grad:
                    source = source.detach()
                (dest if source.dim() == 1 else dest.view(source.shape)).copy_(source)
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


def _receiver_device(source: str, received: torch.device, accelerator: torch.device | None) -> torch.device | None:
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

    Device restore (SPEC §8.5): a CPU source stays on CPU; a source of the
    received device type stays; an accelerator source is moved to
    ``accelerator`` (default: this process's current CUDA device when the
    source was CUDA and CUDA is available), otherwise it stays on CPU.

    Raises LayoutError if a run does not fit the buffer or is inconsistent
    (every tensor of it is checked: a run's bounds are those of its last),
    UnsupportedDtype for an unknown dtype.
    """
    source, length = _byte_source(buffer)
    target = torch.device(accelerator) if accelerator is not None else None
    out: dict[str, torch.Tensor] = {}
    for run in runs:
        dtype = _check_run(run, length)
        pieces: Iterable[torch.Tensor]
        if run.size == 0:
            here = source.device if isinstance(source, torch.Tensor) else _CPU
            pieces = [torch.empty(run.shape, dtype=dtype, device=here) for _ in run.paths]
        else:
            pieces = _view_run(source, run, dtype)
        if run.device != "cpu":
            received = source.device if isinstance(source, torch.Tensor) else _CPU
            try:
                device = _receiver_device(run.device, received, target)
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


def restore(obj: object, tensors: Mapping[str, torch.Tensor], *, partial: bool = False) -> object:
    """Substitute every :class:`TensorPlaceholder` in ``obj`` by its tensor.

    Walks the same containers as :func:`extract_tensors`. Raises LayoutError
    if a placeholder has no tensor, unless ``partial`` (it is left in place).
    """

    def leaf(node: object, path: Path) -> object:
        if not isinstance(node, TensorPlaceholder):
            return node
        try:
            return tensors[node.path]
        except KeyError:
            if partial:
                return node
            raise LayoutError(f"no tensor for placeholder {node.path!r} at {describe_path(path)}") from None

    return _map_containers(obj, leaf)
