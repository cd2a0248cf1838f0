"""A bounded set of request ids that forgets the oldest first.

Stages and schedulers remember aborted or finished ids so late work for them
is dropped. The memory must be bounded, and eviction must be oldest-first:
evicting an arbitrary member (as iterating a ``set`` does) can forget a
fresh id and let late data resurrect state for it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

DEFAULT_CAPACITY = 10_000


class BoundedIdSet:
    """An insertion-ordered set of ids holding at most ``capacity`` members."""

    __slots__ = ("_capacity", "_ids")

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, request_id: str) -> None:
        """Remember ``request_id`` (refreshing its age), evicting the oldest if full."""
        self._ids[request_id] = None
        self._ids.move_to_end(request_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def discard(self, request_id: str) -> None:
        """Forget ``request_id`` if present."""
        self._ids.pop(request_id, None)

    def pop(self, request_id: str) -> bool:
        """Forget ``request_id``; return whether it was present."""
        return self._ids.pop(request_id, 0) is None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)
