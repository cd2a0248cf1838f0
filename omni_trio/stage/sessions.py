"""How a stage routes session operations.

A request whose metadata carries ``omni_session`` is one operation of a
long-lived session whose state lives in the *owner* stages listed in its
``stages``. Non-append operations complete at the owner that ran them. An
append follows the owners in order over fixed, linear edges: an owner that
streams to the next owner forwards the append there when it admits it, so the
next owner computes it while the chunks the first one emits stream in; once
the owner's own append finished it only sends stream-done. The last owner
completes the append like a terminal stage. :class:`SessionAdmission` is where
a stage admits an operation: it aborts what the operation preempts, checks an
append's route and forwards the append.
"""

from __future__ import annotations

from typing import Any, Protocol

from omni_trio.errors import describe_error
from omni_trio.payload import StagePayload
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.stage.routing import CompiledRouting, RoutingError
from omni_trio.stage.scopes import RequestScopes

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


class SendsPayloads(Protocol):
    """Where an admitted append is forwarded from (a stage's :class:`~omni_trio.stage.outbound.Outbound`)."""

    async def send_payload(self, request_id: str, target: str, payload: StagePayload, *, single: bool) -> None:
        """Send ``payload`` to stage ``target``."""


class AdmittingStage(Protocol):
    """What session admission asks of its stage (:class:`~omni_trio.stage.stage.Stage`)."""

    def on_abort(self, request_id: str) -> None:
        """Drop everything about ``request_id`` here."""

    def has_retired(self, request_id: str) -> bool:
        """Whether the stage dropped ``request_id`` (aborted or failed)."""

    async def send_failure(self, request_id: str, error: str, *, refused: bool = False) -> None:
        """Fail ``request_id`` here."""


class SessionAdmission:
    """Admits the session operations reaching one stage, named ``stage_name``, before its scheduler sees them.

    ``routing`` are the stage's edges (an append's route is checked against them),
    ``scopes`` its per-request cancel scopes (an abort cancels a forward under way),
    ``outbound`` where it forwards an append to the next owner.
    """

    def __init__(
        self,
        stage_name: str,
        routing: CompiledRouting,
        scopes: RequestScopes,
        outbound: SendsPayloads,
        stage: AdmittingStage,
    ) -> None:
        self._name = stage_name
        self._routing = routing
        self._scopes = scopes
        self._outbound = outbound
        self._stage = stage

    async def admit(self, request_id: str, payload: StagePayload, operation: SessionOperation) -> bool:
        """Abort what the operation preempts; check an append's route and forward it to the next owner.
        False when the request failed (or was aborted meanwhile) and must not reach the scheduler."""
        for preempted in operation.preempted_request_ids:
            if preempted != request_id:
                self._stage.on_abort(preempted)
        if operation.op != "append":
            return True
        try:
            # Checked before computing too: a wrong route must not stream anywhere first.
            following = check_append_route(
                operation, self._name, self._routing.stream_to, self._routing.get_next(request_id, payload)
            )
            if following is not None:
                with self._scopes.open(request_id):
                    await self._outbound.send_payload(request_id, following, payload, single=False)
        except Exception as exc:  # noqa: BLE001 - a bad route or transport fails only this request
            await self._stage.send_failure(request_id, f"forwarding the session append: {describe_error(exc)}")
            return False
        return not self._stage.has_retired(request_id)
