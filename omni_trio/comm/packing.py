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
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import attrs
import torch

from omni_trio.comm.layout import ELEMENT_SIZES, TensorEntry
from omni_trio.errors import OmniTrioError

__all__ = [
    "SUPPORTED_DTYPES",
    "LayoutError",
    "TensorEntry",
    "TensorPlaceholder",
    "UnsupportedDtype",
    "UnsupportedTensor",
    "dtype_from_str",
    "extract_tensors",
    "pack_tensors",
    "restore",
    "tensor_nbytes",
    "tensor_path",
    "unpack_tensors",
    "write_packed",
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
    """Stands in for an extracted tensor inside the header.

    A dedicated class (not a dict) so that user data can never be mistaken for
    a placeholder. Picklable: the receiver imports this module anyway.
    """

    index: int
    shape: tuple[int, ...]
    dtype: str
    device: str

    @property
    def path(self) -> str:
        """The key of this tensor in the ``{path: tensor}`` mapping."""
        return tensor_path(self.index)

    def __reduce__(self) -> tuple[type[TensorPlaceholder], tuple[int, tuple[int, ...], str, str]]:
        # Pickled with every small chunk: its fields as a tuple cost a third of attrs' state dict.
        return (TensorPlaceholder, (self.index, self.shape, self.dtype, self.device))


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


def _check_tensor(tensor: torch.Tensor, where: Callable[[], str]) -> str:
    """Validate a tensor for the data plane; return its dtype string. ``where()`` describes its place
    (called only to word an error)."""
    name = str(tensor.dtype)
    if name not in SUPPORTED_DTYPES:
        raise UnsupportedDtype(
            f"tensor at {where()} has unsupported dtype {name}; supported: {', '.join(sorted(SUPPORTED_DTYPES))}"
        )
    # Sparse/mkldnn/nested tensors have no single strided byte image to copy.
    if tensor.layout is not torch.strided or tensor.is_nested:
        raise UnsupportedTensor(f"tensor at {where()} has unsupported layout {tensor.layout}")
    if tensor.device.type == "meta":
        raise UnsupportedTensor(f"tensor at {where()} is on the meta device (it has no data)")
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


def _map_containers(
    obj: object,
    leaf: Callable[[object, Path], object],
) -> object:
    """Walk dicts/lists/tuples, applying ``leaf`` to everything else.

    Containers are rebuilt only when something inside changed (identity
    comparison), so tensor-free data is returned without copying. ``leaf``
    receives the node's :data:`Path`, for error messages.
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
                new_value = _walk(value, (path, key), leaf, active)
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
                new_value = _walk(value, (path, i), leaf, active)
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


#: Types that hold no tensor, skipped by :func:`tensor_nbytes` before any ``isinstance`` check.
_LEAVES = frozenset({str, bytes, int, float, bool, type(None)})


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
        dtype = _check_tensor(node, functools.partial(describe_path, path))
        placeholder = TensorPlaceholder(
            index=next(counter),
            shape=tuple(node.shape),
            dtype=dtype,
            device=str(node.device),
        )
        by_identity[id(node)] = placeholder
        tensors[placeholder.path] = node
        return placeholder

    return _map_containers(obj, leaf), tensors


def pack_tensors(tensors: Mapping[str, torch.Tensor]) -> tuple[int, list[TensorEntry]]:
    """Compute the packed layout of ``tensors`` (insertion order).

    Each tensor's offset is aligned to its element size. Returns the total
    byte length (at least 1: a transfer always has a non-empty buffer) and
    one :class:`TensorEntry` per tensor. No bytes are copied here; see
    :func:`write_packed`.
    """
    entries: list[TensorEntry] = []
    cursor = 0
    for path, tensor in tensors.items():
        dtype = _check_tensor(tensor, functools.partial(repr, path))
        elem = tensor.element_size()
        offset = -(-cursor // elem) * elem  # round up to a multiple of elem
        size = tensor.numel() * elem
        entries.append(
            TensorEntry(
                path=path,
                shape=tuple(tensor.shape),
                dtype=dtype,
                device=str(tensor.device),
                offset=offset,
                size=size,
            )
        )
        cursor = offset + size
    return max(cursor, 1), entries


def write_packed(
    buffer: memoryview,
    tensors: Mapping[str, torch.Tensor],
    entries: Iterable[TensorEntry],
) -> None:
    """Copy each tensor's bytes into ``buffer`` at its entry's offset.

    ``buffer`` must be writable and at least as long as the layout (e.g. a
    memoryview of an mmap). Each destination slice is viewed as a tensor of
    the source's dtype and shape and filled with one ``copy_`` (a run of
    small CPU tensors of one dtype and shape with one ``torch.stack``), so
    non-contiguous sources and device-to-host copies need no intermediate
    buffer. All views of ``buffer`` are dropped before returning, so the
    caller can close its mmap right after.
    """
    if buffer.readonly:
        raise ValueError("write_packed needs a writable buffer")
    length = buffer.nbytes
    for run in _runs(entries):
        for entry in run:
            if entry.size and (entry.offset < 0 or entry.offset + entry.size > length):
                raise LayoutError(
                    f"tensor {entry.path!r} [{entry.offset}, {entry.offset + entry.size}) "
                    f"does not fit a buffer of {length} bytes"
                )
        first = run[0]
        if first.size == 0:
            continue  # torch.frombuffer rejects count=0; nothing to copy anyway
        dtype = SUPPORTED_DTYPES[first.dtype]
        if len(run) == 1:
            source = tensors[first.path].detach()
            dest = torch.frombuffer(buffer, dtype=dtype, count=source.numel(), offset=first.offset).view(source.shape)
            try:
                dest.copy_(source)
            finally:
                # torch.frombuffer keeps a reference to ``buffer`` but no buffer
                # export: a view surviving this call would let the caller close
                # its mmap under a live tensor. Drop it before returning.
                del dest
            continue
        count = first.size // dtype.itemsize
        dest = torch.frombuffer(buffer, dtype=dtype, count=count * len(run), offset=first.offset)
        try:
            torch.stack([tensors[entry.path].detach() for entry in run], out=dest.view(len(run), *first.shape))
        finally:
            del dest


def _runs(entries: Iterable[TensorEntry]) -> Iterator[list[TensorEntry]]:
    """The entries in order, cut into runs that one torch call can write or view: consecutive CPU
    tensors of one dtype and shape, each right after the one before (a stream's small chunks; torch's
    per-call overhead, ~3 µs a tensor, was most of their packing). Any other entry is a run of one."""
    run: list[TensorEntry] = []
    for entry in entries:
        if run and not _continues(run[-1], entry):
            yield run
            run = []
        run.append(entry)
    if run:
        yield run


def _continues(before: TensorEntry, entry: TensorEntry) -> bool:
    return (
        entry.size > 0
        and entry.device == "cpu"
        and before.device == "cpu"
        and entry.dtype == before.dtype
        and entry.shape == before.shape
        and entry.offset == before.offset + before.size
    )


def _as_byte_tensor(buffer: memoryview | bytes | bytearray | torch.Tensor) -> torch.Tensor:
    if isinstance(buffer, torch.Tensor):
        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise LayoutError("a tensor buffer must be a contiguous 1-D uint8 tensor")
        return buffer
    view = memoryview(buffer)
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if view.readonly:
        # torch.frombuffer on read-only memory warns and would hand out
        # tensors that must not be written; copy once into owned memory.
        view = memoryview(bytearray(view))
    # Zero-copy: the tensors keep ``view`` (and through it the buffer) alive.
    return torch.frombuffer(view.cast("B"), dtype=torch.uint8)


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
    """Rebuild ``{path: tensor}`` from a packed buffer.

    The tensors are views of one byte tensor wrapping ``buffer`` (a writable
    memoryview or a uint8 tensor is used in place; read-only bytes are copied
    once). Never pass a memoryview of an mmap you will close explicitly:
    torch keeps a reference to the memoryview but no buffer export, so the
    close succeeds and the tensors dangle. Copy the mapping into
    ``torch.empty(n, dtype=torch.uint8)`` first, or let reference counting
    own the mapping (see :func:`omni_trio.comm.oneshot.read_segment`).

    Device restore (SPEC §8.5): a CPU source stays on CPU; a source of the
    received device type stays; an accelerator source is moved to
    ``accelerator`` (default: this process's current CUDA device when the
    source was CUDA and CUDA is available), otherwise it stays on CPU.

    Raises LayoutError if an entry does not fit the buffer or is
    inconsistent, UnsupportedDtype for an unknown dtype.
    """
    base = _as_byte_tensor(buffer)
    length = base.numel()
    target = torch.device(accelerator) if accelerator is not None else None
    out: dict[str, torch.Tensor] = {}
    paths: set[str] = set()
    for run in _runs(entries):
        for entry in run:
            _check_entry(entry, length)
            if entry.path in paths:
                raise LayoutError(f"duplicate tensor path {entry.path!r}")
            paths.add(entry.path)
        first = run[0]
        dtype = dtype_from_str(first.dtype)
        if first.size == 0:
            tensor = torch.empty(first.shape, dtype=dtype, device=base.device)
        else:
            # Validated above; one slice and one unbind for a run (CPU: nothing to move).
            shape = first.shape if len(run) == 1 else (len(run), *first.shape)
            try:
                tensor = base[first.offset : first.offset + first.size * len(run)].view(dtype).view(shape)
            except RuntimeError as exc:  # e.g. a caller's uint8 tensor at an odd storage offset
                raise LayoutError(f"tensor {first.path!r}: {exc}") from None
            if len(run) > 1:
                out.update(zip([entry.path for entry in run], tensor.unbind(0), strict=True))
                continue
        try:
            device = None if first.device == "cpu" else _receiver_device(first.device, base.device, target)
        except RuntimeError as exc:  # torch.device() of a malformed device string
            raise LayoutError(f"tensor {first.path!r}: bad device {first.device!r}") from exc
        if device is not None:
            tensor = tensor.to(device)
        out[first.path] = tensor
    return out


def _check_entry(entry: TensorEntry, length: int) -> None:
    """Raise LayoutError unless ``entry`` describes a tensor inside a buffer of ``length`` bytes."""
    elem = dtype_from_str(entry.dtype).itemsize
    if any(d < 0 for d in entry.shape):
        raise LayoutError(f"tensor {entry.path!r} has a negative dimension {entry.shape}")
    if entry.size != math.prod(entry.shape) * elem:
        raise LayoutError(f"tensor {entry.path!r}: size {entry.size} != {math.prod(entry.shape)} x {elem} bytes")
    if entry.offset < 0 or entry.offset % elem or entry.offset + entry.size > length:
        raise LayoutError(
            f"tensor {entry.path!r} [{entry.offset}, {entry.offset + entry.size}) "
            f"is misaligned or outside a buffer of {length} bytes"
        )


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
