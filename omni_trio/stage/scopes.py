"""Per-request cancel scopes: abort cancels a request's in-flight work in a stage."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


class RequestScopes:
    """``request_id -> {CancelScope}`` for the work a stage is doing for each request.

    Work for a request runs inside ``with scopes.open(request_id):``;
    ``cancel(request_id)`` cancels all of it. The cancelled block ends at its
    ``with`` statement, so the task doing it (the outbox drain, a receive task)
    carries on with other requests.
    """

    def __init__(self) -> None:
        self._scopes: dict[str, set[trio.CancelScope]] = {}

    @contextmanager
    def open(self, request_id: str) -> Iterator[trio.CancelScope]:
        """A cancel scope for work on ``request_id``, registered while the block runs."""
        scope = trio.CancelScope()
        bucket = self._scopes.setdefault(request_id, set())
        bucket.add(scope)
        try:
            with scope:
                yield scope
        finally:
            bucket.discard(scope)
            if not bucket and self._scopes.get(request_id) is bucket:
                del self._scopes[request_id]

    def cancel(self, request_id: str) -> None:
        """Cancel every block currently running for ``request_id``."""
        for scope in self._scopes.pop(request_id, ()):
            scope.cancel()

    def __len__(self) -> int:
        return len(self._scopes)
