"""The scheduler contract: how a stage and its compute thread talk.

A stage hands work to its scheduler as :class:`IncomingMessage` objects in
``scheduler.inbox`` and routes whatever the scheduler puts into
``scheduler.outbox`` as :class:`OutgoingMessage` objects. Both queues are
``queue.Queue`` so the scheduler can block on them from its own thread.
"""

from __future__ import annotations

import queue
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

IncomingType = Literal["new_request", "stream_chunk", "stream_done", "abort", "wakeup", "admin"]
OutgoingType = Literal["result", "stream", "error", "admitted", "kv_transfer", "wakeup"]

INCOMING_TYPES: frozenset[str] = frozenset(
    ("new_request", "stream_chunk", "stream_done", "abort", "wakeup", "admin")
)
OUTGOING_TYPES: frozenset[str] = frozenset(
    ("result", "stream", "error", "admitted", "kv_transfer", "wakeup")
)


def _check_type(allowed: frozenset[str]) -> Any:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in allowed:
            raise ValueError(
                f"{type(instance).__name__}.type must be one of {sorted(allowed)}, got {value!r}"
            )

    return check


@attrs.frozen(eq=False)
class IncomingMessage:
    """A message from the stage to its scheduler.

    ``new_request`` carries a ``StagePayload``; ``stream_chunk`` a
    ``StreamItem``; ``stream_done`` the name of the stage whose stream ended. ``wakeup`` is the stop sentinel
    that unblocks a scheduler waiting on its inbox.
    """

    request_id: str
    type: IncomingType = attrs.field(validator=_check_type(INCOMING_TYPES))
    data: Any = None


@attrs.frozen(eq=False)
class OutgoingMessage:
    """A message from a scheduler to its stage.

    ``result``: the request's output here (routed to the next stages, or to
    the caller from a terminal stage). ``stream``: a partial output, to
    ``target`` or to every stream target. ``error``: fail the request with
    ``str(data)``. ``admitted``: mark the request active at this stage.
    ``kv_transfer``: not supported; fails the request. ``wakeup``: internal
    sentinel that ends the stage's outbox drain.
    """

    request_id: str
    type: OutgoingType = attrs.field(validator=_check_type(OUTGOING_TYPES))
    data: Any = None
    target: str | None = None
    metadata: dict[str, Any] | None = None


@runtime_checkable
class StageScheduler(Protocol):
    """What a stage needs from a scheduler.

    ``start`` is the blocking serve loop, run on the scheduler's own thread;
    ``stop`` must make a blocked ``start`` return promptly (a sentinel, never
    a timeout poll). ``abort`` runs on the stage's event loop and must be
    quick and thread-safe.

    Optional members a scheduler may add: ``enqueue(msg)`` (used instead of
    ``inbox.put`` for ``new_request``; runs on the event loop and must not
    block), ``attach_loop(nursery)`` (the stage calls it on its event loop
    before serving: the scheduler may run async compute as tasks of that
    nursery, see ``scheduling/on_loop.py``), and
    ``claim_result(result, terminal=...) -> bool`` with
    ``release_result(result, delivered=...)`` for schedulers that own their
    results (:class:`ResultOwner`).
    """

    @property
    def inbox(self) -> queue.Queue[IncomingMessage]:
        """Where the stage puts what arrives for the scheduler (an :class:`~omni_trio.scheduling.inbox.Inbox`
        also tells the stage when a chunk was taken)."""

    @property
    def outbox(self) -> queue.Queue[OutgoingMessage]:
        """Where the scheduler puts what it produces (an :class:`~omni_trio.scheduling.outbox.Outbox`
        wakes the stage's drain; a plain queue is drained by a pump thread)."""

    def warm_up_serving_thread(self) -> None:
        """Run once on the scheduler's thread before :meth:`start` (a model's warm-up); raising fails the
        stage's start-up with the error."""

    def start(self) -> None:
        """Serve on the scheduler's thread until :meth:`stop`."""

    def stop(self) -> None:
        """Make a blocked :meth:`start` return promptly (from any thread)."""

    def abort(self, request_id: str) -> None:
        """Drop ``request_id`` (runs on the stage's event loop: quick and thread-safe)."""


@runtime_checkable
class ResultOwner(Protocol):
    """A scheduler that owns its results: the stage asks before routing one and tells when it is done.

    ``claim_result`` returns False when ``result`` is not to be routed (``terminal``: it would
    go to the caller); ``release_result`` runs once per result the stage had, claimed or dropped
    (``delivered``: it reached its destination).
    """

    def claim_result(self, result: Any, *, terminal: bool) -> bool:
        """Whether the stage may route ``result`` now."""

    def release_result(self, result: Any, *, delivered: bool) -> None:
        """The stage is done with ``result`` (sent when ``delivered``, else dropped or failed)."""
