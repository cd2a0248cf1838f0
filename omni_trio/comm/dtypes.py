"""Which tensors may cross the data plane, checked at the sender.

An unsupported dtype raises :class:`UnsupportedDtype` naming the tensor's
location; a sparse, mkldnn, nested or meta tensor raises :class:`UnsupportedTensor`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from omni_trio.comm.layout import ELEMENT_SIZES
from omni_trio.errors import OmniTrioError

__all__ = ["DTYPE_NAMES", "SUPPORTED_DTYPES", "UnsupportedDtype", "UnsupportedTensor", "check_tensor", "dtype_from_str"]

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


def dtype_from_str(name: str) -> torch.dtype:
    """Return the torch dtype for a wire dtype string, or raise UnsupportedDtype."""
    try:
        return SUPPORTED_DTYPES[name]
    except KeyError:
        raise UnsupportedDtype(f"unsupported tensor dtype {name!r}") from None


#: ``str(dtype)`` of each supported dtype, keyed by the dtype itself: a dict lookup per tensor.
DTYPE_NAMES: Mapping[torch.dtype, str] = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}


def check_tensor(tensor: torch.Tensor, place: Any, describe: Callable[[Any], str]) -> str:
    """Validate a tensor for the data plane; return its dtype string. ``describe(place)`` words its
    place in an error (called only then: one small call per tensor, no closure built for it)."""
    name = DTYPE_NAMES.get(tensor.dtype)
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
