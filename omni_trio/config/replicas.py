"""Stage and process addresses under replicas, and each process's request -> replica bindings.

A process group with ``replicas=N`` runs as N worker processes ``p@r0`` ..
``p@r{N-1}``; stage ``s`` of the group is *addressed* ``s@rK`` in replica K
(control messages, ACKs, stats keys), while its *name* stays ``s`` (routing,
fan-in, results). The coordinator binds every request to one replica of each
replicated group when it admits the request (:mod:`omni_trio.replicas`); the
binding, ``{group: K}``, travels with the request's Submit and DataReady
messages, and each process keeps it in a :class:`BindingTable` for as long as
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

#: The holder name the coordinator uses in its process's table (stage names are never empty).
COORDINATOR_HOLDER = ""


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


class BindingTable:
    """One process's replica bindings of the requests it holds: ``request_id -> {group: replica}``.

    An entry lives while it has holders (stages of this process, or the
    coordinator, that hold the request): :meth:`hold` adds one (and learns the
    binding when a message brought it), :meth:`release` removes one, and the
    entry goes with its last holder.
    """

    def __init__(self, config: PipelineConfig) -> None:
        groups = replica_groups(config)
        #: stage name -> its group, for replicated stages only.
        self._group_of = {s.name: s.process for s in config.stages if s.process is not None and s.process in groups}
        self._bindings: dict[str, dict[str, int]] = {}
        self._holders: dict[str, set[str]] = {}

    def hold(self, request_id: str, holder: str, bindings: dict[str, int] | None = None) -> None:
        """``holder`` holds ``request_id`` (a no-op when the request has no binding here)."""
        if bindings and request_id not in self._bindings:
            self._bindings[request_id] = dict(bindings)
        holders = self._holders.get(request_id)
        if holders is None:
            if request_id not in self._bindings:
                return
            holders = self._holders[request_id] = set()
        holders.add(holder)

    def release(self, request_id: str, holder: str) -> None:
        """``holder`` let ``request_id`` go; the binding goes with its last holder."""
        holders = self._holders.get(request_id)
        if holders is None:
            return
        holders.discard(holder)
        if not holders:
            del self._holders[request_id]
            del self._bindings[request_id]

    def of(self, request_id: str) -> dict[str, int] | None:
        """The request's binding, to forward with its messages (None when it has none here)."""
        return self._bindings.get(request_id)

    def replica(self, request_id: str, stage: str) -> int:
        """The replica of replicated ``stage`` that ``request_id`` is bound to (LookupError if unbound)."""
        binding = self._bindings.get(request_id)
        group = self._group_of[stage]
        if binding is None or group not in binding:
            raise LookupError(f"request {request_id!r} has no replica binding for stage {stage!r} here")
        return binding[group]

    def replica_of(self, request_id: str, stage: str) -> int | None:
        """Like :meth:`replica`, but None for a stage that is not replicated."""
        return self.replica(request_id, stage) if stage in self._group_of else None

    def needs(self, request_id: str, process: str) -> bool:
        """Whether ``request_id`` may need worker ``process``: any group's process, and only its bound replica."""
        group, replica = split_replica(process)
        if replica is None:
            return True
        binding = self._bindings.get(request_id)
        return binding is None or binding.get(group) == replica

    def __len__(self) -> int:
        return len(self._bindings)
