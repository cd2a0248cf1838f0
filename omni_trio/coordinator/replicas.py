"""Which replica serves a request: the policy protocol, least-in-flight, and the coordinator's dispatcher.

The coordinator binds each request, when it admits it, to one replica of
every replicated process group (docs/design.md, "Replicas"). A *policy*
chooses: any object with

    choose(request_id, request, group, replicas) -> int

where ``group`` is the process group's name (``"p_voc"``), ``replicas`` the
:class:`ReplicaLoad` of each replica that can take work now (never empty),
and the answer one of their ``index`` values. ``PipelineConfig.replica_policy``
(or a group's ``StageConfig.replica_policy``) names a callable by dotted
path that returns such an object when called without arguments (a class
will do). The default is :class:`LeastInFlight`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from omni_trio.config import PipelineConfig
from omni_trio.config.hooks import import_string
from omni_trio.config.replicas import replica_groups, replica_name, split_replica
from omni_trio.control.bindings import COORDINATOR_HOLDER, BindingTable
from omni_trio.payload import OmniRequest


@attrs.frozen
class ReplicaLoad:
    """One replica as a policy sees it: its index, its process and the requests bound to it that are live."""

    index: int
    process: str
    in_flight: int


class ReplicaPolicy(Protocol):
    """Chooses the replica of a process group for a new request (see the module docstring)."""

    def choose(self, request_id: str, request: OmniRequest, group: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The ``index`` of one of ``replicas``."""
        ...


class LeastInFlight:
    """The replica with the fewest live requests bound to it; ties go round robin."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def choose(self, request_id: str, request: OmniRequest, group: str, replicas: Sequence[ReplicaLoad]) -> int:
        """The least loaded replica, the first at or after the group's round-robin cursor among equals."""
        low = min(replica.in_flight for replica in replicas)
        tied = [replica.index for replica in replicas if replica.in_flight == low]
        cursor = self._next.get(group, 0)
        pick = next((index for index in tied if index >= cursor), tied[0])
        self._next[group] = pick + 1
        return pick


def load_policy(path: str | None) -> ReplicaPolicy:
    """The policy a dotted path names (None: :class:`LeastInFlight`)."""
    if path is None:
        return LeastInFlight()
    policy: ReplicaPolicy = import_string(path)()
    if not callable(getattr(policy, "choose", None)):
        raise TypeError(f"replica policy {path!r} returned {type(policy).__name__}, which has no choose() method")
    return policy


class ReplicaDispatcher:
    """The coordinator's replica bookkeeping: bindings of live requests, load and state of each replica.

    A replica is *up* (takes new requests), *restarting* (takes none, unless no
    replica of its group is up: then the request waits for it like any submit
    waits for a restarting worker) or *dead* (takes none).
    """

    def __init__(self, config: PipelineConfig, table: BindingTable) -> None:
        self._table = table
        self._groups = replica_groups(config)
        default = config.replica_policy
        self._policies: dict[str, ReplicaPolicy] = {}
        for stage in config.stages:
            if stage.process in self._groups and stage.process not in self._policies:
                self._policies[stage.process] = load_policy(stage.replica_policy or default)
        self._in_flight = {group: [0] * count for group, count in self._groups.items()}
        self._state: dict[str, str] = {}  # replica process -> "restarting" | "dead"; absent: up
        self._bound: dict[str, dict[str, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._groups)

    def bind(self, request_id: str, request: OmniRequest) -> dict[str, int]:
        """Choose a replica of every group for a new request and record the binding (ValueError: none left)."""
        binding: dict[str, int] = {}
        for group, policy in self._policies.items():
            loads = self._candidates(group)
            choice = policy.choose(request_id, request, group, loads)
            if choice not in {load.index for load in loads}:
                raise ValueError(
                    f"replica policy of {group!r} chose {choice!r}, not one of {[load.index for load in loads]}"
                )
            binding[group] = choice
        for group, choice in binding.items():
            self._in_flight[group][choice] += 1
        self._bound[request_id] = binding
        self._table.hold(request_id, COORDINATOR_HOLDER, binding)
        return binding

    def _candidates(self, group: str) -> list[ReplicaLoad]:
        loads = [
            ReplicaLoad(k, replica_name(group, k), count) for k, count in enumerate(self._in_flight[group])
        ]
        for wanted in (None, "restarting"):
            chosen = [load for load in loads if self._state.get(load.process) == wanted]
            if chosen:
                return chosen
        raise ValueError(f"no replica of process group {group!r} is alive")

    def release(self, request_id: str) -> None:
        """The request ended: it no longer counts against its replicas."""
        binding = self._bound.pop(request_id, None)
        if binding is None:
            return
        for group, choice in binding.items():
            self._in_flight[group][choice] -= 1
        self._table.release(request_id, COORDINATOR_HOLDER)

    def is_replica(self, process: str) -> bool:
        """Whether ``process`` is a replica of a replicated group."""
        group, index = split_replica(process)
        return index is not None and group in self._groups

    def bound_to(self, process: str) -> set[str]:
        """The live requests bound to replica ``process``."""
        group, index = split_replica(process)
        return {rid for rid, binding in self._bound.items() if binding.get(group) == index}

    def survivable(self, process: str) -> bool:
        """Whether the pipeline can go on without replica ``process``: another of its group is not dead."""
        if not self.is_replica(process):
            return False
        group, index = split_replica(process)
        siblings = [replica_name(group, k) for k in range(self._groups[group]) if k != index]
        return any(self._state.get(name) != "dead" for name in siblings)

    def mark(self, process: str, state: str | None) -> None:
        """Replica ``process`` is ``"restarting"``, ``"dead"``, or (None) up again."""
        if state is None:
            self._state.pop(process, None)
        else:
            self._state[process] = state

    def down(self) -> tuple[str, ...]:
        """The replica processes that take no work now, sorted."""
        return tuple(sorted(self._state))
