"""Each process's replica bindings: which replica of each replicated group a request it holds is bound to.

The coordinator binds a request when it admits it (:mod:`omni_trio.coordinator.replicas`); the binding
travels with the request's messages, and every process that holds the request keeps it here.
"""

from __future__ import annotations

from omni_trio.config import PipelineConfig
from omni_trio.config.replicas import replica_groups, split_replica

#: The holder name the coordinator uses in its process's table (stage names are never empty).
COORDINATOR_HOLDER = ""


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
