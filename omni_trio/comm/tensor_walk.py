"""Finding the tensors of a payload, and putting them back.

A payload crosses processes as a *header*, the payload object with every
tensor replaced by a :class:`TensorPlaceholder` (pickled), and the tensors'
bytes (:mod:`omni_trio.comm.packing`).

SGLang-Omni keyed tensors by a path built from
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
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from omni_trio.comm.dtypes import check_tensor
from omni_trio.comm.layout import LayoutError

__all__ = ["Path", "TensorPlaceholder", "describe_path", "extract_tensors", "restore", "tensor_nbytes", "tensor_path"]

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
        check_tensor(node, path, describe_path)
        placeholder = TensorPlaceholder(next(counter))
        by_identity[id(node)] = placeholder
        tensors[placeholder.path] = node
        return placeholder

    return _map_containers(obj, leaf), tensors


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
