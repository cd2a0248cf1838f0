"""Workers the runtime does not start as its own children: the ``manual`` and ``ray`` launchers.

:class:`RemoteWorkers` is what the supervisor calls for a process group placed with one of them
(``PipelineConfig.processes``): it returns a :class:`~omni_trio.runtime.remote.join.RemoteProcess` standing for the
worker, which joins the run over TCP (:mod:`omni_trio.runtime.remote.join`); a ``ray`` worker's actor is started
here (:mod:`omni_trio.runtime.remote.ray_launch`) and killed when the worker is given up or the run stops.

Each replica of a replicated group (``p@r0`` ...) is a worker of its own: a ``manual`` replica has its
own key file and command (and, with ``ProcessConfig.hosts``, its own host), a ``ray`` replica its own
actor, placed with the group's resources and spread over the cluster's nodes
(:class:`~omni_trio.runtime.remote.ray_launch.RayLauncher`).

A restart (``restart="on-failure"``) calls :meth:`RemoteWorkers.start` again: a ``manual`` group's
command is logged again (an orchestrator restarts it, with the same key file), a ``ray`` group's dead
actor is killed (its resources freed) and a new one started with the same resources (a replica's in
its own bundle, so on the same node); either way the
new worker joins as a new incarnation (:class:`~omni_trio.runtime.remote.join.ManualWorkers`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from omni_trio.config.processes import ProcessConfig, bind_host
from omni_trio.control.endpoint import Endpoint
from omni_trio.runtime.remote.join import ManualWorkers, RemoteProcess
from omni_trio.runtime.remote.ray_launch import RayLauncher

__all__ = ["RemoteWorkers"]


class RemoteWorkers:
    """The ``manual`` and ``ray`` workers of one run (``make_spec(process, main)``: a joined worker's
    spec, ``main`` where it reaches the caller; ``replicas``: the replica count of each replicated group)."""

    def __init__(
        self, endpoint: Endpoint, make_spec: Callable[[str, str], object], key_dir: Path, replicas: dict[str, int]
    ) -> None:
        self._manual = ManualWorkers(endpoint, make_spec, key_dir)
        self._ray = RayLauncher(replicas)

    async def start(self, process: str, placement: ProcessConfig, nursery: trio.Nursery) -> RemoteProcess:
        """Have ``process`` (a group, or one replica of it: ``p@rK``) started its ``placement``'s way;
        the stand-in for it until it joins and after."""
        if placement.launcher == "manual":
            host = bind_host(placement, process)
            assert host is not None  # validated
            key = self._manual.key(process, host)
            return self._manual.expect(process, nursery, key_file=key)
        remote = self._manual.expect(process, nursery, on_kill=lambda: self._ray.kill(process))
        # A Ray worker binds on the node Ray places it on: it fills in its host there.
        await self._ray.start(process, placement, self._manual.key(process, ""))
        return remote

    def superseded_messages(self) -> dict[str, int]:
        """Per process, the messages of its given-up incarnations that were dropped (see ``ManualWorkers``)."""
        return dict(self._manual.superseded_messages)

    async def close(self) -> None:
        """Kill what is left of the run's Ray actors."""
        await self._ray.close()
