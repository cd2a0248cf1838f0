"""A stage's config: :class:`StageConfig` (its factory, placement, edges, restarts, replicas) and
:class:`CommConfig` (its outgoing data plane), with the converters the config classes share.

Hooks are dotted paths (``"pkg.module.attr"``) so a config can cross into worker processes; a
module-level function is accepted too and stored as its dotted path.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import attrs

from omni_trio.config.hooks import dotted_path
from omni_trio.config.processes import RESTART_FIELDS

#: The process name of stages placed in the caller's process (``process=None``).
MAIN_PROCESS = "main"
#: The suffix of a replica's name (``voc@r1``, ``p_voc@r1``); stage names must not end in it.
REPLICA_SUFFIX = re.compile(r"@r(\d+)$")
#: The placeholder a string factory argument may hold; each replica gets its index there.
REPLICA_PLACEHOLDER = "{replica}"


def optional_dotted(value: Any) -> Any:
    """Converter: ``None``, or a hook as its dotted path."""
    return None if value is None else dotted_path(value)


def name_list(value: Any) -> Any:
    """Converter: a tuple or list of names as a list (anything else as it is, for validation to name)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def _optional_list(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _with_replica(value: Any, replica: int) -> Any:
    """``value`` with every ``{replica}`` in its strings (nested in lists and dicts too) replaced."""
    if isinstance(value, str):
        return value.replace(REPLICA_PLACEHOLDER, str(replica))
    if isinstance(value, list):
        return [_with_replica(item, replica) for item in value]
    if isinstance(value, dict):
        return {key: _with_replica(item, replica) for key, item in value.items()}
    return value


def _hook_map(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: dotted_path(hook) for key, hook in value.items()}
    return value


@attrs.frozen
class CommConfig:
    """Data-plane settings of one stage's outgoing edges.

    ``slot_size_mb`` caps one transfer (a larger payload fails its request);
    ``credits`` is the number of transfers to one target that may be
    outstanding (sent, not yet acknowledged) before the sender waits;
    ``pool_mb`` bounds the stage's pool of reusable shared-memory slots
    (transfers up to half of it are pooled; 0 turns pooling off).
    """

    slot_size_mb: int = 512
    credits: int = 2
    pool_mb: int = 256


@attrs.frozen
class StageConfig:
    """One stage: its scheduler factory, its placement and its edges.

    Exactly one of ``next`` (downstream stage or stages) and
    ``terminal=True`` must be given. ``factory`` holds keyword arguments for
    the factory. ``process=None`` runs the stage inside the caller's process.

    ``restart``, ``max_restarts`` and ``restart_backoff_s`` are deprecated here: they are the
    restart policy of the stage's process, set once on its
    :class:`~omni_trio.ProcessConfig` (``PipelineConfig.processes``). Set on a stage, they still
    apply to its process, with a ``DeprecationWarning``; every stage of one process must then agree,
    and agree with the process's own non-default values. ``None``: not set here.

    ``replicas=N`` runs the stage's whole process group in N worker
    processes, ``<process>@r0`` to ``<process>@r{N-1}``; each request is
    bound to one replica of the group for everything it sends there (see
    docs/concepts.md, "Replicas"). ``replica_factory`` (one dict per
    replica) overlays ``factory`` per replica, and ``{replica}`` in a string
    of ``factory`` becomes the replica's index. ``replica_policy`` names the
    group's dispatch policy (default: ``PipelineConfig.replica_policy``).
    """

    name: str
    factory_path: str = attrs.field(converter=dotted_path)
    factory: dict[str, Any] = attrs.field(factory=dict)
    process: str | None = None
    next: str | list[str] | None = attrs.field(default=None, converter=name_list)
    terminal: bool = False
    route_fn: str | None = attrs.field(default=None, converter=optional_dotted)
    wait_for: list[str] | None = attrs.field(default=None, converter=name_list)
    merge_fn: str | None = attrs.field(default=None, converter=optional_dotted)
    wait_for_fn: str | None = attrs.field(default=None, converter=optional_dotted)
    project_payload: dict[str, str] = attrs.field(factory=dict, converter=_hook_map)
    stream_to: list[str] = attrs.field(factory=list, converter=name_list)
    stream_done_to_fn: str | None = attrs.field(default=None, converter=optional_dotted)
    can_accept_stream_before_payload: bool = False
    disable_direct_cuda_ipc_payload: bool = False
    gpu: int | None = None
    comm: CommConfig | None = None
    restart: str | None = None
    max_restarts: int | None = None
    restart_backoff_s: float | None = None
    replicas: int = 1
    replica_factory: list[dict[str, Any]] | None = attrs.field(default=None, converter=_optional_list)
    replica_policy: str | None = attrs.field(default=None, converter=optional_dotted)

    def __attrs_post_init__(self) -> None:
        moved = [field for field in RESTART_FIELDS if getattr(self, field) is not None]
        if not moved:
            return
        settings = ", ".join(f"{field}={getattr(self, field)!r}" for field in moved)
        if self.process is None:
            where = "it has no effect here: the stage runs in the caller's process, which is never restarted"
        else:
            where = f"set it once, on processes[{self.process!r}] = ProcessConfig({settings})"
        warnings.warn(
            f"StageConfig {', '.join(moved)} (stage {self.name!r}) is deprecated: it is its process's restart "
            f"policy; {where}",
            DeprecationWarning,
            stacklevel=3,
        )

    def factory_kwargs(self, replica: int) -> dict[str, Any]:
        """The ``factory`` kwargs of replica ``replica``: ``{replica}`` in strings replaced by its
        index, then overlaid by its entry of ``replica_factory``."""
        kwargs = {key: _with_replica(value, replica) for key, value in self.factory.items()}
        if self.replica_factory is not None:
            kwargs.update(self.replica_factory[replica])
        return kwargs

    @property
    def next_stages(self) -> list[str]:
        """The static downstream stages as a list (empty for a terminal stage)."""
        if self.next is None:
            return []
        return [self.next] if isinstance(self.next, str) else list(self.next)
