"""Per-request cancel scopes: abort cancels a request's in-flight work in a stage."""

from __future__ import annotations

from types import TracebackType

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

    def open(self, request_id: str) -> _Registered:
        """A cancel scope for work on ``request_id``, registered while the block runs."""
        return _Registered(self._scopes, request_id)

    def cancel(self, request_id: str) -> None:
        """Cancel every block currently running for ``request_id``."""
        for scope in self._scopes.pop(request_id, ()):
            scope.cancel()

    def __len__(self) -> int:
        return len(self._scopes)


class _Registered:
    """``with`` block of :meth:`RequestScopes.open`: a class, not a ``@contextmanager`` generator,
    because routing enters one per send and a generator-based manager costs several times more."""

    __slots__ = ("_bucket", "_request_id", "_scope", "_scopes")

    def __init__(self, scopes: dict[str, set[trio.CancelScope]], request_id: str) -> None:
        self._scopes = scopes
        self._request_id = request_id
        self._scope = trio.CancelScope()
        self._bucket: set[trio.CancelScope] = set()

    def __enter__(self) -> trio.CancelScope:
        self._bucket = self._scopes.setdefault(self._request_id, set())
        self._bucket.add(self._scope)
        return self._scope.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        try:
            return self._scope.__exit__(kind, error, traceback)
        finally:
            self._bucket.discard(self._scope)
            if not self._bucket and self._scopes.get(self._request_id) is self._bucket:
                del self._scopes[self._request_id]
