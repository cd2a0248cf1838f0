"""The ``ray`` launcher: a process group's worker inside a Ray actor, placed by its resources.

The actor is a plain synchronous one (no asyncio actor): its one long-running method runs the worker's
own ``trio.run``, the same code as ``omni-trio worker --join`` (:mod:`omni_trio.runtime.remote.worker_join`). The run's
keys travel only as the method's arguments; the worker binds on its Ray node's IP address (Ray, not the
config, knows where it lands), joins the caller over CURVE, and from there is a ``manual`` worker that
the runtime started: its death is noticed the same way (its TCP connection drops), and stopping the
pipeline also kills the actor.

Ray is optional: ``pip install 'omni-trio[ray]'``. A pipeline with a ``ray`` group connects to
``ray_address`` (``None``: ``ray.init()``'s default, a local cluster or ``RAY_ADDRESS``).
"""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import trio

from omni_trio.config.processes import ProcessConfig
from omni_trio.config.replicas import split_replica
from omni_trio.runtime.remote.join import KeyFile
from omni_trio.tracing.trace import get_logger

__all__ = ["RayLauncher"]

log = get_logger(__name__)

#: How long stopping waits for the actors' workers to finish before killing the actors.
CLEANUP_S = 5.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("a process group with launcher = 'ray' needs Ray: pip install 'omni-trio[ray]'") from None
    return ray


def _run_worker(join_address: str, key: dict[str, str]) -> int:
    """The actor's method: the worker's trio.run on this node (returns when the pipeline ends)."""
    import ray

    from omni_trio.runtime.remote.worker_join import join

    node_key = KeyFile(**{**key, "host": ray.util.get_node_ip_address()})
    trio.run(join, join_address, node_key)
    return 0


def _options(placement: ProcessConfig, scheduling: Any) -> dict[str, Any]:
    """Ray's actor options for ``placement.resources`` (CPU and GPU are Ray's own options), placed by
    ``scheduling`` (a Ray scheduling strategy)."""
    resources = dict(placement.resources)
    return {
        "num_cpus": resources.pop("CPU", 0),
        "num_gpus": resources.pop("GPU", 0),
        "resources": resources,
        "scheduling_strategy": scheduling,
        # The worker runs until the pipeline ends: no retries, no restarts by Ray (the runtime decides).
        "max_restarts": 0,
        "max_task_retries": 0,
    }


class RayLauncher:
    """Starts the actors of a run's ``ray`` process groups and kills them when told to.

    ``replicas``: the replica count of each replicated group. Such a group's resources are reserved
    once, as a placement group of one bundle per replica with Ray's ``SPREAD`` strategy (the bundles
    land on different nodes where the cluster has them); replica K's actor, and each actor that
    replaces it after a restart, runs in bundle K. A replicated group without resources has nothing
    to reserve: its actors are placed with the ``SPREAD`` scheduling strategy (best effort).
    """

    def __init__(self, replicas: dict[str, int]) -> None:
        self._replicas = replicas
        self._actors: dict[str, Any] = {}
        self._calls: dict[str, Any] = {}
        #: Per replicated group with resources, its placement group (removed at :meth:`close`).
        self._reserved: dict[str, Any] = {}

    async def start(self, process: str, placement: ProcessConfig, key: KeyFile) -> None:
        """Start ``process``'s actor (a group's, or a replica's: ``p@rK``) with ``placement``'s resources;
        it joins with ``key``. An actor the process had (it died, or lost its connection) is killed first:
        its resources are the new one's."""
        ray = _ray()
        self.kill(process)
        if not ray.is_initialized():
            # Connecting to a cluster blocks for a while: not on the trio loop.
            await trio.to_thread.run_sync(lambda: ray.init(address=placement.ray_address, log_to_driver=False))
        worker_class = ray.remote(_WorkerActor)
        # Named after its process (unique per actor: a restart's actor is a new one) for whoever
        # looks at the cluster: the dashboard, `ray list actors`, ray.get_actor().
        name = f"omni-trio-{process}-{uuid.uuid4().hex[:8]}"
        scheduling = await self._scheduling(process, placement)
        actor = worker_class.options(name=name, **_options(placement, scheduling)).remote()
        self._actors[process] = actor
        self._calls[process] = actor.run.remote(key.join, attrs.asdict(key))
        log.info("ray_worker_started", process=process, actor=name, resources=placement.resources)

    async def _scheduling(self, process: str, placement: ProcessConfig) -> Any:
        """Where ``process``'s actor goes: Ray's default for a group of one; a replica in its bundle
        of its group's placement group, or spread (see the class docstring)."""
        group, index = split_replica(process)
        count = self._replicas.get(group)
        if index is None or count is None:
            return "DEFAULT"
        if not placement.resources:
            return "SPREAD"
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        reserved = self._reserved.get(group)
        if reserved is None:
            bundles = [dict(placement.resources) for _ in range(count)]
            # A call to Ray's control store: not on the trio loop.
            reserved = self._reserved[group] = await trio.to_thread.run_sync(
                lambda: placement_group(bundles, strategy="SPREAD", name=f"omni-trio-{group}-{uuid.uuid4().hex[:8]}")
            )
        return PlacementGroupSchedulingStrategy(placement_group=reserved, placement_group_bundle_index=index)

    async def close(self) -> None:
        """Kill every actor still there, once its worker finished cleaning up (at most
        :data:`CLEANUP_S`; a worker that was told to stop has, or never joined); free the reserved
        resources."""
        calls = list(self._calls.values())
        if calls:
            ray = _ray()
            await trio.to_thread.run_sync(lambda: ray.wait(calls, num_returns=len(calls), timeout=CLEANUP_S))
        for process in list(self._actors):
            self.kill(process)
        if self._reserved:
            from ray.util.placement_group import remove_placement_group

            for group in list(self._reserved):
                remove_placement_group(self._reserved.pop(group))

    def kill(self, process: str) -> None:
        """Kill ``process``'s actor (its worker process with it)."""
        actor = self._actors.pop(process, None)
        self._calls.pop(process, None)
        if actor is not None:
            _ray().kill(actor, no_restart=True)


class _WorkerActor:
    """The Ray actor of one worker: a synchronous class, one long-running call."""

    def run(self, join_address: str, key: dict[str, str]) -> int:
        """Serve until the pipeline ends."""
        return _run_worker(join_address, key)
