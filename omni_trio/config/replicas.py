"""Stage and process addresses under replicas: the names ``s@rK`` and what a config places where.

A process group with ``replicas=N`` runs as N worker processes ``p@r0`` ..
``p@r{N-1}``; stage ``s`` of the group is *addressed* ``s@rK`` in replica K
(control messages, ACKs, stats keys), while its *name* stays ``s`` (routing,
fan-in, results). The coordinator binds every request to one replica of each
replicated group when it admits the request (:mod:`omni_trio.coordinator.replicas`); the
binding, ``{group: K}``, travels with the request's Submit and DataReady
messages, and each process keeps it in a :class:`~omni_trio.control.bindings.BindingTable` for as long as
one of its stages (or, in the caller's process, the coordinator) holds the
request. A stage's ``ReplicaLink`` (:mod:`omni_trio.stage.links`) sends each
request's data to the replica of its binding, so the payload, every stream
chunk, fan-in inputs and the stream-done signal of one request all reach the
same replica.

A base module: the stages, the control plane, the coordinator and the runtime
all name replicas the same way, so it imports nothing above the config.
"""

from __future__ import annotations

from omni_trio.config import MAIN_PROCESS, REPLICA_SUFFIX, PipelineConfig


def replica_name(name: str, replica: int) -> str:
    """The name of replica ``replica`` of a stage or a process group: ``name@r<replica>``."""
    return f"{name}@r{replica}"


def split_replica(name: str) -> tuple[str, int | None]:
    """``("voc", 1)`` for ``"voc@r1"``; ``(name, None)`` for a name without a replica suffix."""
    match = REPLICA_SUFFIX.search(name) if "@r" in name else None
    if match is None:
        return name, None
    return name[: match.start()], int(match.group(1))


def logical_name(address: str) -> str:
    """The stage name behind an address (``voc@r1`` -> ``voc``)."""
    return split_replica(address)[0]


def replica_groups(config: PipelineConfig) -> dict[str, int]:
    """The replicated process groups of ``config`` and their replica counts (groups with replicas > 1)."""
    return {stage.process: stage.replicas for stage in config.stages if stage.process and stage.replicas > 1}


def worker_processes(config: PipelineConfig) -> list[str]:
    """Every worker process of ``config``, sorted: one per group, N per replicated group."""
    groups = replica_groups(config)
    names: set[str] = set()
    for stage in config.stages:
        if stage.process is not None:
            count = groups.get(stage.process)
            names.update([stage.process] if count is None else [replica_name(stage.process, k) for k in range(count)])
    return sorted(names)


def addressed_placement(config: PipelineConfig) -> dict[str, str]:
    """Each stage address's process: ``main`` for embedded stages, one entry per replica for replicated ones."""
    groups = replica_groups(config)
    placement: dict[str, str] = {}
    for stage in config.stages:
        count = groups.get(stage.process or "")
        if count is None:
            placement[stage.name] = stage.process or MAIN_PROCESS
        else:
            for k in range(count):
                placement[replica_name(stage.name, k)] = replica_name(stage.process or "", k)
    return placement


def addresses_of(config: PipelineConfig, stage: str) -> list[str]:
    """The addresses of ``stage``: itself, or one per replica."""
    groups = replica_groups(config)
    count = groups.get(config.stage(stage).process or "")
    return [stage] if count is None else [replica_name(stage, k) for k in range(count)]
