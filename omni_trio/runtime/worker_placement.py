"""Where the stages of a multi-process pipeline run, as the coordinator sees it.

:class:`WorkerPlacement` is the coordinator's :class:`~omni_trio.coordinator.placement.Placement`
when stages run in worker processes: submits go to the entry stage's process,
aborts go point to point to every live worker and are confirmed by each, resent
until they are (:mod:`omni_trio.control.aborts`; so when an abort returns, no
stage holds the request any more), workers' reports of what their stages
hold are checked against the live requests (:mod:`omni_trio.control.audit`),
and stats are gathered from every process. The stages' reports (results, stream chunks,
failures) reach the coordinator through :mod:`omni_trio.runtime.stage_reports`.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import attrs
import trio

from omni_trio.comm.dataref import DataRefKind
from omni_trio.comm.transfer import tensor_bytes
from omni_trio.config import MAIN_PROCESS
from omni_trio.config.replicas import replica_name
from omni_trio.control.aborts import AbortDelivery, Awaited
from omni_trio.control.bindings import BindingTable
from omni_trio.control.endpoint import COORDINATOR, Endpoint
from omni_trio.control.wire import messages as m
from omni_trio.errors import StatsTimeout
from omni_trio.payload import StagePayload
from omni_trio.stage.stats import StageStats
from omni_trio.tracing.trace import get_logger

if TYPE_CHECKING:
    from omni_trio.runtime.workers.supervisor import Supervisor
    from omni_trio.stage.stage import Stage

log = get_logger(__name__)

#: How long stats() waits for every worker's reply.
STATS_TIMEOUT_S = 10.0
#: How long a worker's death waits to learn which requests the other workers hold (a request held
#: by a worker that does not answer in time counts as lost with the dead one).
HOLDERS_TIMEOUT_S = 0.5


@attrs.define(eq=False)
class _Replies(Awaited):
    stages: dict[str, Any] = attrs.field(factory=dict)


class WorkerPlacement:
    """Reaches stages in the caller's process directly and the others through the endpoint."""

    def __init__(
        self, local: dict[str, Stage], endpoint: Endpoint, supervisor: Supervisor, bindings: BindingTable
    ) -> None:
        self._local = local
        self._endpoint = endpoint
        self._supervisor = supervisor
        #: The caller's process's replica bindings (the coordinator holds each live request's).
        self._bindings = bindings
        self._aborts = AbortDelivery(endpoint)
        self._stats: dict[int, _Replies] = {}
        self._holding: dict[int, _Replies] = {}
        self._tokens = itertools.count()
        #: Each worker's refused frames, as of its last stats reply.
        self._refused: dict[str, int] = {}
        #: Each worker's refused connections, as of its last stats reply.
        self._refused_connections: dict[str, int] = {}
        #: Each worker's undeliverable messages, as of its last stats reply.
        self._undeliverable: dict[str, int] = {}
        #: Submits waiting for a restarting process, by request id: an abort releases them.
        self._held: dict[str, trio.CancelScope] = {}
        endpoint.on(m.AbortDone, self._on_abort_done)
        endpoint.on(m.StatsReply, self._on_stats_reply)
        endpoint.on(m.HeldReply, self._on_held_reply)

    def _live(self) -> set[str]:
        return {worker.name for worker in self._supervisor.live_workers()}

    def health(self) -> dict[str, str]:
        """Each worker's state: ready, starting, restarting or dead; ``main`` is always ready."""
        restarting = set(self._supervisor.restarting())
        states = {MAIN_PROCESS: "ready"}
        for name, worker in self._supervisor.workers.items():
            if name in restarting:
                states[name] = "restarting"
            elif worker.live:
                states[name] = "ready"
            elif worker.exited.is_set() or worker.failure is not None:
                states[name] = "dead"
            else:
                states[name] = "starting"
        return states

    def forget(self, process: str) -> None:
        """A worker is gone: stop waiting for its replies (and for its ACKs)."""
        self._endpoint.forget_peer(process)
        self._aborts.forget(process)
        for replies in [*self._stats.values(), *self._holding.values()]:
            replies.arrived(process)

    async def holders(self, timeout: float = HOLDERS_TIMEOUT_S) -> dict[str, str]:
        """``request_id -> process`` for the requests a live process holds now (the caller's own stages,
        then each live worker that answers within ``timeout``; the first holder found of each)."""
        found = {request_id: MAIN_PROCESS for stage in self._local.values() for request_id in stage.active}
        token = next(self._tokens)
        replies = self._holding[token] = _Replies(self._live())
        try:
            with trio.move_on_after(timeout):
                for process in sorted(replies.waiting):
                    await self._endpoint.send(process, m.HeldRequest(token=token))
                if replies.waiting:
                    await replies.done.wait()
        finally:
            del self._holding[token]
        if replies.waiting:
            log.warning("holders_not_answered", processes=sorted(replies.waiting), timeout_s=timeout)
        for request_id, process in sorted(replies.stages.items()):
            found.setdefault(request_id, process)
        return found

    async def _on_held_reply(self, message: m.HeldReply) -> None:
        replies = self._holding.get(message.token)
        if replies is not None:
            for request_id in message.request_ids:
                replies.stages.setdefault(request_id, message.process)
            replies.arrived(message.process)

    async def submit(self, stage: str, payload: StagePayload) -> None:
        """Hand a new request to the entry stage, wherever it runs.

        While a worker the request may need is being restarted, the request
        waits until it is ready (every stage is reachable from the entry stage,
        so it may need any worker; of a replicated group, only the replica it is
        bound to); aborting the request (its deadline, its caller) ends the wait.
        """
        request_id = payload.request_id
        needed = [name for name in self._supervisor.restarting() if self._bindings.needs(request_id, name)]
        if needed:
            with trio.CancelScope() as held:
                self._held[request_id] = held
                try:
                    await self._supervisor.wait_restarts(needed)
                finally:
                    del self._held[request_id]
            if held.cancelled_caught:
                return  # aborted while it waited: the coordinator already resolved it
            workers = self._supervisor.workers
            if not all(workers[name].live for name in needed if name in workers):
                return  # the restart failed (or the pipeline stops): the request was failed with it
        bindings = self._bindings.of(request_id)
        if stage in self._local:
            self._endpoint.transports(COORDINATOR).note("submit", stage, "local_object", tensor_bytes(payload))
            await self._local[stage].on_submit(payload, bindings)
            return
        replica = None if bindings is None else self._bindings.replica_of(request_id, stage)
        if replica is not None:
            stage = replica_name(stage, replica)
        await self._endpoint.send_object(
            payload,
            request_id=request_id,
            sender=COORDINATOR,
            receiver=stage,
            kind=DataRefKind.stage_payload,
            direction="submit",
            make=lambda ref: m.Submit(request_id=request_id, to_stage=stage, data_ref=ref, replica_bindings=bindings),
        )

    def abort(self, request_id: str) -> trio.Event:
        """Every stage drops ``request_id``: the caller's stages now, the workers' once their abort queues
        send it; the event fires once every live worker confirmed.

        It fires at the latest :data:`~omni_trio.control.aborts.WAIT_BOUND_S` after the abort was
        sent (a worker that stopped answering does not hold its caller for good); the delivery
        itself goes on, resent until every worker confirmed or is known gone.
        """
        held = self._held.get(request_id)
        if held is not None:
            held.cancel()
        for stage in self._local.values():
            stage.on_abort(request_id)
        return self._aborts.deliver(request_id, self._live()).released

    async def _on_abort_done(self, message: m.AbortDone) -> None:
        self._aborts.on_done(message)

    async def stats(self, timeout: float | None = None) -> dict[str, StageStats]:
        """Counters of every stage in every process; :class:`StatsTimeout` names the processes that
        did not answer within ``timeout`` seconds (default :data:`STATS_TIMEOUT_S`)."""
        timeout = STATS_TIMEOUT_S if timeout is None else timeout
        result = {name: stage.stats() for name, stage in self._local.items()}
        # Stages of a process being restarted (or of a dead replica) hold nothing, and serve nothing;
        # a restarting one says so (it is not idle: it will serve again, and submits wait for it).
        # Taken with the live set, at one moment: a process that becomes ready while we wait for
        # the replies was asked nothing, and must still be reported.
        restarting = set(self._supervisor.restarting())
        dead = {worker.name for worker in self._supervisor.workers.values() if worker.exited.is_set()}
        token = next(self._tokens)
        replies = self._stats[token] = _Replies(self._live())
        try:
            with trio.move_on_after(timeout):
                for process in sorted(replies.waiting):
                    await self._endpoint.send(process, m.StatsRequest(reply_to="main", token=token))
                if replies.waiting:
                    await replies.done.wait()
        finally:
            del self._stats[token]
        if replies.waiting:
            raise StatsTimeout(sorted(replies.waiting), timeout)
        for name, counters in replies.stages.items():
            result[name] = StageStats(**counters)
        for name, process in self._endpoint.placement.items():
            if process in restarting:
                result[name] = StageStats(0, 0, 0, 0, 0, 0, healthy=False, restarting=True)
            elif process in dead:
                result.setdefault(name, StageStats(0, 0, 0, 0, 0, 0, healthy=False))
        return result

    def refused_frames(self) -> dict[str, int]:
        """Per process, the messages its sockets refused (no proof of this run, or a broken stream; workers:
        as of stats())."""
        return {MAIN_PROCESS: self._endpoint.refused, **self._refused}

    def refused_connections(self) -> dict[str, int]:
        """Per process, the connections its inbox closed for its limits (workers: as of stats())."""
        return {MAIN_PROCESS: self._endpoint.refused_connections, **self._refused_connections}

    def undeliverable(self) -> dict[str, int]:
        """Per process, the messages it dropped because nobody listened at a peer's path (workers: as of
        stats())."""
        return {MAIN_PROCESS: self._endpoint.undeliverable, **self._undeliverable}

    def superseded_messages(self) -> dict[str, int]:
        """Per process that joined over TCP, the messages of its given-up incarnations that were dropped."""
        return self._supervisor.superseded_messages()

    def sent_bytes(self) -> dict[str, dict[str, int]]:
        """Tensor bytes submitted, by entry stage (or replica address) and transport."""
        return self._endpoint.transports(COORDINATOR).sent_bytes()

    async def _on_stats_reply(self, message: m.StatsReply) -> None:
        replies = self._stats.get(message.token)
        if replies is not None:
            self._refused[message.process] = message.refused_frames
            self._refused_connections[message.process] = message.refused_connections
            self._undeliverable[message.process] = message.undeliverable
            replies.stages.update(message.stages)
            replies.arrived(message.process)
