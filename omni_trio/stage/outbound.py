"""A stage's outbound side: where each message of its scheduler's outbox goes, and how it gets there.

The stage's drain hands each batch of outgoing messages to :meth:`Outbound.handle_batch`,
which routes it over the stage's links: stream chunks to their stream targets (or,
from a terminal stage, to the caller), each result to the next stages (stream-done
signals first) or to the caller, and a scheduler's error as the request's failure.
A stage with more than one destination sends on lanes (see :mod:`.edges`).

Which requests the stage holds or has retired, and how it holds, lets go of, clears
or fails one, the outbound side asks its stage (a :class:`RequestKeeper`): the only
request state kept here is the chunk numbering. An exception in user code (a routing
hook, a projector) or in a transport fails only the request it belongs to.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from omni_trio.errors import QueueFullError, describe_error
from omni_trio.payload import RoutedPayloads, StagePayload, StreamItem
from omni_trio.scheduling.protocol import OutgoingMessage, ResultOwner
from omni_trio.scheduling.session_operation import SessionOperation
from omni_trio.stage.edges import EdgeQueues
from omni_trio.stage.links import CoordinatorLink, StageLink
from omni_trio.stage.routing import CompiledRouting, is_isolated_projection
from omni_trio.stage.scopes import RequestScopes
from omni_trio.stage.sessions import check_append_route, session_operation
from omni_trio.tracing.trace import Tracer


class RequestKeeper(Protocol):
    """What the outbound side asks of its stage about one request (:class:`~omni_trio.stage.stage.Stage`)."""

    def holds(self, request_id: str) -> bool:
        """Whether the stage holds ``request_id`` (admitted, not finished or dropped)."""

    def has_retired(self, request_id: str) -> bool:
        """Whether the stage dropped ``request_id`` (aborted or failed): late output for it goes nowhere."""

    def hold(self, request_id: str) -> None:
        """Hold ``request_id`` (the scheduler admitted it)."""

    def let_go(self, request_id: str) -> None:
        """``request_id`` left the stage: its replica binding may go."""

    def clear_request_state(self, request_id: str) -> None:
        """Forget the stage's state of ``request_id`` (its result was routed)."""

    async def send_failure(self, request_id: str, error: str, *, refused: bool = False) -> None:
        """Fail ``request_id`` with ``error`` (a routing hook or a transport failed)."""


class Outbound:
    """Routes one stage's outgoing messages over its links and lanes (see the module docstring).

    ``stage`` is the :class:`RequestKeeper` whose requests these are; ``results`` the
    scheduler, when it owns its results (:class:`~omni_trio.scheduling.protocol.ResultOwner`).
    The links come later (:meth:`connect`, as the stage's do), and the lanes once the stage
    runs (:meth:`use_lanes`): they are tasks of its nursery.
    """

    def __init__(
        self,
        name: str,
        routing: CompiledRouting,
        coordinator: CoordinatorLink,
        tracer: Tracer,
        scopes: RequestScopes,
        *,
        stage: RequestKeeper,
        results: ResultOwner | None,
    ) -> None:
        self._name = name
        self._routing = routing
        self._coordinator = coordinator
        self._tracer = tracer
        self._scopes = scopes
        self._stage = stage
        self._results = results
        self._links: dict[str, StageLink] = {}
        #: One send lane per destination, for a stage with more than one (see :mod:`.edges`).
        self._edges: EdgeQueues | None = None
        #: ``request_id -> {destination: next chunk id}``; the caller is ``"coordinator"``.
        self._chunk_ids: dict[str, dict[str, int]] = {}
        self._in_flight_sends = 0

    # ------------------------------------------------------------------ set-up, and what the stage reads

    def connect(self, links: dict[str, StageLink]) -> None:
        """Send over ``links`` (one per stage the stage may send to)."""
        self._links = dict(links)

    def use_lanes(self, edges: EdgeQueues) -> None:
        """Send on ``edges``' lanes from now on (a stage with more than one destination, once it runs)."""
        self._edges = edges

    @property
    def has_lanes(self) -> bool:
        """Whether sends go out on lanes (other tasks) rather than from the drain itself."""
        return self._edges is not None

    @property
    def in_flight(self) -> int:
        """Sends under way, and lane items queued or being sent."""
        return self._in_flight_sends + (0 if self._edges is None else self._edges.queued)

    def forget(self, request_id: str) -> None:
        """Drop the chunk numbering of ``request_id`` (its state at the stage is cleared)."""
        self._chunk_ids.pop(request_id, None)

    # ------------------------------------------------------------------ outbox messages, stream runs

    async def handle_batch(self, batch: list[OutgoingMessage]) -> bool:
        """Route one batch; return True when the stop sentinel was reached."""
        run: list[tuple[OutgoingMessage, tuple[str, ...]]] = []
        for out in batch:
            if out.type == "stream" and (targets := self._stream_targets(out)) is not None:
                run.append((out, targets))
                continue
            if run:
                await self._route_stream_run(run)
                run = []
            if out.type == "wakeup":
                if self._edges is not None:
                    await self._edges.flush()
                return True
            if out.type == "result" and self._edges is not None:
                # Routed by its own task, each send on its lane: not in the drain's way.
                await self._edges.route(functools.partial(self._handle_outgoing, out))
                continue
            await self._handle_outgoing(out)
        if run:
            await self._route_stream_run(run)
        return False

    async def _handle_outgoing(self, out: OutgoingMessage) -> None:
        request_id = out.request_id
        if out.type == "admitted":
            if not self._stage.has_retired(request_id):
                self._stage.hold(request_id)
            return
        if not self._stage.holds(request_id):
            # Late output of an aborted or finished request is dropped here.
            if out.type == "result" and self._results is not None:
                self._results.release_result(out.data, delivered=False)
            return
        if out.type == "result":
            try:
                await self._route_result(request_id, out.data)
            except Exception as exc:  # noqa: BLE001 - user hooks and transports fail only this request
                await self._stage.send_failure(request_id, f"routing the result: {describe_error(exc)}")
        elif out.type == "stream":
            # Only chunks with nowhere to go get here (see _stream_targets).
            await self._stage.send_failure(
                request_id,
                "the scheduler emitted an untargeted stream chunk, but this stage has no stream_to "
                "and is not terminal; set stream_to or OutgoingMessage.target",
            )
        elif out.type == "error":
            await self._stage.send_failure(request_id, describe_error(out.data),
                                           refused=isinstance(out.data, QueueFullError))
        elif out.type == "kv_transfer":
            await self._stage.send_failure(request_id, "kv_transfer unsupported: omni-trio does not move KV pages")

    async def _guarded(self, request_id: str, what: str, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one request's routing work in its cancel scope; errors fail only that request."""
        try:
            with self._scopes.open(request_id):
                await work(*args)
        except Exception as exc:  # noqa: BLE001 - user hooks and transports fail only this request
            await self._stage.send_failure(request_id, f"{what}: {describe_error(exc)}")

    def _stream_targets(self, out: OutgoingMessage) -> tuple[str, ...] | None:
        """Where a stream chunk goes: its target, else every ``stream_to`` stage, else (a terminal
        stage) the caller, spelled ``()``; None when it has nowhere to go."""
        if out.target is not None:
            return (out.target,)
        if self._routing.stream_to:
            return tuple(self._routing.stream_to)
        return () if self._routing.terminal else None

    async def _route_stream_run(self, run: list[tuple[OutgoingMessage, tuple[str, ...]]]) -> None:
        """Send chunks in order, one call per consecutive group of one request and one destination."""
        for (rid, targets), members in itertools.groupby(run, key=lambda pair: (pair[0].request_id, pair[1])):
            if self._stage.holds(rid):
                group = [out for out, _ in members]
                if self._edges is None:
                    await self._guarded(rid, "sending a stream chunk", self._send_stream_group, rid, targets, group)
                    continue
                for target in targets or (_CALLER,):
                    lane_targets = () if target == _CALLER else (target,)
                    work = functools.partial(self._lane_send, rid, lane_targets, group)
                    await self._edges.send(target, len(group), work)

    async def _lane_send(self, request_id: str, targets: tuple[str, ...], group: list[OutgoingMessage]) -> None:
        """One lane's turn: send the group unless the request was dropped while it waited."""
        if self._stage.holds(request_id):
            send = self._send_stream_group
            await self._guarded(request_id, "sending a stream chunk", send, request_id, targets, group)

    async def _on_edge(self, destination: str, request_id: str, send: Callable[[], Awaitable[None]]) -> None:
        """Send a result's message to ``destination``: on its lane (after that edge's earlier sends)
        when the stage has lanes, else at once."""
        if self._edges is None:
            await send()
        else:
            await self._edges.call(destination, self._in_turn(request_id, send))

    def _in_turn(self, request_id: str, send: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """``send`` as a lane runs it: in the request's scope, and not at all once the request was dropped."""

        async def in_turn() -> None:
            if not self._stage.has_retired(request_id):
                with self._scopes.open(request_id):
                    await send()

        return in_turn

    async def _send_stream_group(self, request_id: str, targets: tuple[str, ...], group: list[OutgoingMessage]) -> None:
        if not targets:
            await self._stream_to_caller(group)
        elif len(targets) == 1:
            await self._send_stream(request_id, targets[0], group)
        else:
            async with trio.open_nursery() as nursery:
                for target in targets:
                    nursery.start_soon(self._send_stream, request_id, target, group)

    async def _stream_to_caller(self, messages: list[OutgoingMessage]) -> None:
        """Send one request's chunks to the caller, a call per consecutive run of one modality."""
        request_id = messages[0].request_id
        ids = self._chunk_ids.setdefault(request_id, {})
        for modality, members in itertools.groupby(messages, key=_modality):
            chunks = [out.data for out in members]
            first_id = ids.get("coordinator", 0)
            ids["coordinator"] = first_id + len(chunks)
            await self._coordinator.stream(request_id, self._name, chunks, first_id, modality)

    async def _send_stream(self, request_id: str, target: str, messages: list[OutgoingMessage]) -> None:
        link = self._link(target)
        ids = self._chunk_ids.setdefault(request_id, {})
        first_id = ids.get(target, 0)
        ids[target] = first_id + len(messages)
        items = [
            StreamItem(first_id + i, out.data, self._name, out.metadata) for i, out in enumerate(messages)
        ]
        await self._counted(link.stream_chunks(request_id, self._name, items))

    async def _counted(self, send: Awaitable[None]) -> None:
        self._in_flight_sends += 1
        try:
            await send
        finally:
            self._in_flight_sends -= 1

    def _link(self, target: str) -> StageLink:
        link = self._links.get(target)
        if link is None:
            raise LookupError(f"no route from stage {self._name!r} to unknown stage {target!r}")
        return link

    # ------------------------------------------------------------------ results

    async def _route_result(self, request_id: str, result: Any) -> None:
        operation = session_operation(result)
        if operation is not None:
            await self._route_session(request_id, result, operation)
            return
        next_stages = self._routing.get_next(request_id, result)
        if self._results is not None and not self._results.claim_result(result, terminal=next_stages is None):
            return
        delivered = False
        try:
            with self._scopes.open(request_id):
                await self._dispatch_result(request_id, result, next_stages)
            if next_stages is None and not self._stage.has_retired(request_id):
                # Sent after the request's state here is cleared and its scope closed:
                # once the caller has the result, this stage holds nothing of it.
                data = result.data if isinstance(result, StagePayload) else result
                if self._edges is not None:
                    await self._edges.reached(_CALLER)  # after the request's chunks to the caller
                await self._coordinator.complete(request_id, self._name, result=data)
            delivered = True
        finally:
            if self._results is not None:
                self._results.release_result(result, delivered=delivered)

    async def _route_session(self, request_id: str, result: StagePayload, operation: SessionOperation) -> None:
        """Complete a session operation here, or (a middle owner's append) end its stream to the next owner."""
        following = None
        if operation.op == "append":
            next_stages = self._routing.get_next(request_id, result)
            following = check_append_route(operation, self._name, self._routing.stream_to, next_stages)
        if following is not None:
            # The next owner has the append since admission: it only needs to hear the stream ended.
            with self._scopes.open(request_id):
                await self._on_edge(following, request_id, functools.partial(self._signal_done, following, request_id))
            self._stage.clear_request_state(request_id)
            return
        self._stage.clear_request_state(request_id)
        if not self._stage.has_retired(request_id):
            if self._edges is not None:
                await self._edges.reached(_CALLER)  # after the request's chunks to the caller
            await self._coordinator.complete(request_id, self._name, result=result.data)

    async def _dispatch_result(self, request_id: str, result: Any, next_stages: str | list[str] | None) -> None:
        done_targets = self._routing.stream_done_targets(request_id, result)
        if self._edges is None:
            for target in done_targets:
                await self._signal_done(target, request_id)
        keep_state = isinstance(result, RoutedPayloads) and result.keep_request_state
        targets: list[str] = []
        if next_stages is None:
            if self._tracer.enabled:
                self._tracer.event("stage_complete", request_id=request_id, stage=self._name, terminal=True)
        else:
            targets = [next_stages] if isinstance(next_stages, str) else next_stages
            if self._tracer.enabled:
                self._tracer.event(
                    "stage_complete", request_id=request_id, stage=self._name, terminal=False, next=targets
                )
            if self._name in targets and not keep_state:
                # Routing to itself re-admits the request here: clear before, not after.
                self._stage.clear_request_state(request_id)
                keep_state = True
        single = len(targets) == 1
        if self._edges is None:
            for target in targets:
                await self.send_payload(request_id, target, self._payload_for(result, target), single=single)
        else:
            payloads = {target: self._payload_for(result, target) for target in targets}
            await self._send_on_lanes(request_id, done_targets, payloads, single=single)
        if not keep_state:
            self._stage.clear_request_state(request_id)
        self._stage.let_go(request_id)

    async def _send_on_lanes(
        self, request_id: str, done_targets: list[str], payloads: dict[str, StagePayload], *, single: bool
    ) -> None:
        """A result's sends, each destination's on its lane, all destinations at once: the signal that the
        request's stream ended, then its payload (a slow destination holds up none of the others)."""

        async def to(target: str) -> None:
            if target in done_targets:
                await self._signal_done(target, request_id)
            if target in payloads:
                await self.send_payload(request_id, target, payloads[target], single=single)

        assert self._edges is not None
        targets = [*done_targets, *payloads]
        sends = {target: self._in_turn(request_id, functools.partial(to, target)) for target in targets}
        await self._edges.fan_out(sends)

    async def _signal_done(self, target: str, request_id: str) -> None:
        await self._counted(self._link(target).stream_signal(request_id, self._name))

    @staticmethod
    def _payload_for(result: Any, target: str) -> StagePayload:
        if isinstance(result, RoutedPayloads):
            if target not in result.payloads:
                raise LookupError(f"RoutedPayloads has no payload for next stage {target!r}")
            return result.payloads[target]
        if not isinstance(result, StagePayload):
            raise TypeError(
                f"a non-terminal stage must output a StagePayload (or RoutedPayloads), got {type(result).__name__}"
            )
        return result

    async def send_payload(self, request_id: str, target: str, payload: StagePayload, *, single: bool) -> None:
        """Send ``payload`` to stage ``target``, projected for it; a local target gets the object itself
        when it is the result's only target (``single``) or the projection is isolated, else a copy."""
        link = self._link(target)
        projector = self._routing.projectors.get(target)
        projected = projector(payload) if projector is not None else payload
        share = link.local and (
            single or is_isolated_projection(payload, projected, has_projector=projector is not None)
        )
        await self._counted(link.payload(request_id, self._name, projected, share=share))


#: The lane of the caller (a terminal stage's chunks and completion); no stage has this name.
_CALLER = ""


def _modality(out: OutgoingMessage) -> str | None:
    """The modality a chunk for the caller is labelled with: its metadata's, else its data dict's."""
    if out.metadata and "modality" in out.metadata:
        return out.metadata["modality"]
    if isinstance(out.data, dict):
        return out.data.get("modality")
    return None
