"""How a stage routes session operations (SPEC §3.12).

A request whose metadata carries ``omni_session`` is one operation of a
long-lived session whose state lives in the *owner* stages listed in its
``stages``. Non-append operations complete at the owner that ran them. An
append follows the owners in order over fixed, linear edges: an owner that
streams to the next owner forwards the append there when it admits it, so the
next owner computes it while the chunks the first one emits stream in; once
the owner's own append finished it only sends stream-done. The last owner
completes the append like a terminal stage.
"""

from __future__ import annotations

from typing import Any

from omni_trio.payload import StagePayload
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.stage.routing import RoutingError

#: Why an append's route is refused.
LINEAR_ROUTE = "session route must use fixed, linear payload edges"


def session_operation(payload: Any) -> SessionOperation | None:
    """The session operation ``payload`` carries, None for an ordinary request."""
    if not isinstance(payload, StagePayload):
        return None
    return SessionOperation.from_request(payload.request)


def next_owner(operation: SessionOperation, stage: str) -> str | None:
    """The owner after ``stage`` in the operation's ``stages`` (None at the last one)."""
    if stage not in operation.stages:
        raise RoutingError(f"{LINEAR_ROUTE}: {stage!r} is not one of the session's stages {list(operation.stages)}")
    index = operation.stages.index(stage)
    return operation.stages[index + 1] if index + 1 < len(operation.stages) else None


def check_append_route(
    operation: SessionOperation, stage: str, stream_to: list[str], next_stages: str | list[str] | None
) -> str | None:
    """The next owner of an append at ``stage``, after checking that the stage's edges are the session's.

    A middle owner must stream to exactly the next owner and route its payload
    there; the last owner must be terminal.
    """
    following = next_owner(operation, stage)
    target = next_stages[0] if isinstance(next_stages, list) and len(next_stages) == 1 else next_stages
    if following is None:
        if target is not None:
            raise RoutingError(f"{LINEAR_ROUTE}: the last session stage {stage!r} must be terminal")
        return None
    if target != following or stream_to != [following]:
        raise RoutingError(
            f"{LINEAR_ROUTE}: stage {stage!r} must route and stream to exactly the next session stage "
            f"{following!r} (next={next_stages!r}, stream_to={stream_to!r})"
        )
    return following
