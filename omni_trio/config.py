"""Pipeline configuration: attrs classes, and validation that reports every problem.

``PipelineConfig(...)`` validates the stage graph on construction and raises
:class:`~omni_trio.errors.ConfigError` listing every problem with its path.
Hooks are dotted paths (``"pkg.module.attr"``) so a config can cross into
worker processes; a module-level function is accepted too and stored as its
dotted path. Whether the paths import is checked by :func:`check_imports`
when a pipeline opens.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs

from omni_trio.configwrite import save_config
from omni_trio.errors import ConfigError, ConfigProblem
from omni_trio.hooks import did_you_mean, dotted_path, factory_kwarg_problems, hook_path_problems, import_problem
from omni_trio.processes import ProcessConfig, processes_problems
from omni_trio.tracing import get_logger

log = get_logger(__name__)

#: ``StageConfig.restart`` values: a dead worker ends the pipeline, or is started again.
RESTART_POLICIES = ("never", "on-failure")
#: ``StageConfig.restart_backoff_s`` by default: the wait before a dead worker's first restart.
DEFAULT_RESTART_BACKOFF_S = 0.1
#: The process name of stages placed in the caller's process (``process=None``).
MAIN_PROCESS = "main"
# A worker's name names its socket and spec files: one plain path component.
_PROCESS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
#: The suffix of a replica's name (``voc@r1``, ``p_voc@r1``); stage names must not end in it.
REPLICA_SUFFIX = re.compile(r"@r(\d+)$")
#: The placeholder a string factory argument may hold; each replica gets its index there.
REPLICA_PLACEHOLDER = "{replica}"


def _optional_dotted(value: Any) -> Any:
    return None if value is None else dotted_path(value)


def _name_list(value: Any) -> Any:
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


#: The smallest ``max_message_bytes``: every inline message of the data plane (a pickled object of up
#: to 16 KiB, a run of small stream chunks) must fit.
MIN_MESSAGE_BYTES = 64 * 1024


@attrs.frozen
class EndpointsConfig:
    """The run's IPC sockets: where the per-run IPC directory is created (``None``: the system temp
    dir), and the largest part of a control message they accept (``max_message_bytes``; a bigger one
    is refused by the receiving socket, and the sender fails its request with ``MessageTooLarge``).
    """

    base_path: str | None = None
    max_message_bytes: int = 64 << 20


@attrs.frozen
class StreamDeliveryConfig:
    """Limits on stream output buffered for callers that read slowly: once the events queued for streaming
    callers and not read yet weigh more than ``max_total_backlog_bytes``, the streams whose readers have
    been idle longest fail with :class:`~omni_trio.RequestQueueFull` (:mod:`omni_trio.stream_backlog`)."""

    max_total_backlog_bytes: int = 1 << 30


@attrs.frozen
class ServeConfig:
    """The HTTP front end of a pipeline (``omni-trio serve``, :func:`omni_trio.serve`).

    ``model`` is the model id clients name; ``adapter`` the dotted path of a
    :class:`omni_trio.serve.ServeAdapter` subclass, built with
    ``adapter_options`` as keyword arguments. ``max_body_bytes`` bounds a
    request body (413 beyond it); ``grace_period_s`` is how long in-flight
    requests may finish once the server is asked to stop; ``deadline_s`` is
    the default per-request deadline (504 on expiry; ``None``: none);
    ``retry_after_s`` is the ``Retry-After`` of a 429.
    """

    model: str
    adapter: str = attrs.field(converter=dotted_path)
    adapter_options: dict[str, Any] = attrs.field(factory=dict)
    max_body_bytes: int = 16 << 20
    grace_period_s: float = 10.0
    deadline_s: float | None = None
    retry_after_s: int = 1


@attrs.frozen
class StageConfig:
    """One stage: its scheduler factory, its placement and its edges.

    Exactly one of ``next`` (downstream stage or stages) and
    ``terminal=True`` must be given. ``factory`` holds keyword arguments for
    the factory. ``process=None`` runs the stage inside the caller's process.

    ``restart`` is the policy of the stage's worker process: ``"never"`` (a
    death ends the pipeline) or ``"on-failure"`` (the process is started
    again, at most ``max_restarts`` times over the pipeline's life, the first
    time after ``restart_backoff_s`` seconds, each further attempt after twice
    the wait of the one before). It is a property of the process, so every
    stage of one process must agree; it has no effect on a stage with
    ``process=None``.

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
    next: str | list[str] | None = attrs.field(default=None, converter=_name_list)
    terminal: bool = False
    route_fn: str | None = attrs.field(default=None, converter=_optional_dotted)
    wait_for: list[str] | None = attrs.field(default=None, converter=_name_list)
    merge_fn: str | None = attrs.field(default=None, converter=_optional_dotted)
    wait_for_fn: str | None = attrs.field(default=None, converter=_optional_dotted)
    project_payload: dict[str, str] = attrs.field(factory=dict, converter=_hook_map)
    stream_to: list[str] = attrs.field(factory=list, converter=_name_list)
    stream_done_to_fn: str | None = attrs.field(default=None, converter=_optional_dotted)
    can_accept_stream_before_payload: bool = False
    disable_direct_cuda_ipc_payload: bool = False
    gpu: int | None = None
    comm: CommConfig | None = None
    restart: str = "never"
    max_restarts: int = 3
    restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S
    replicas: int = 1
    replica_factory: list[dict[str, Any]] | None = attrs.field(default=None, converter=_optional_list)
    replica_policy: str | None = attrs.field(default=None, converter=_optional_dotted)

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


@attrs.frozen
class PipelineConfig:
    """A whole pipeline. Validated on construction (see :func:`validate`).

    ``start_method`` says how worker processes start: ``"template"`` (the
    default: one preloaded template process per pipeline forks them, so N
    workers cost about one import of torch and the stage modules) or
    ``"spawn"`` (a fresh interpreter per worker; for stage modules that must
    be imported in every process on their own). See :mod:`omni_trio.runtime.launch`.
    """

    stages: list[StageConfig] = attrs.field(converter=_name_list)
    entry_stage: str | None = None
    model_path: str | None = None
    name: str | None = None
    terminal_stages_fn: str | None = attrs.field(default=None, converter=_optional_dotted)
    endpoints: EndpointsConfig = attrs.field(factory=EndpointsConfig)
    stream_delivery: StreamDeliveryConfig = attrs.field(factory=StreamDeliveryConfig)
    max_in_flight: int | None = None
    replica_policy: str | None = attrs.field(default=None, converter=_optional_dotted)
    serve: ServeConfig | None = None
    start_method: str = "template"
    #: Where process groups run (see :mod:`omni_trio.processes`); a group not listed is a local child.
    processes: dict[str, ProcessConfig] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        problems = validate(self)
        for problem in problems:
            if problem.severity == "warning":
                log.warning("config_warning", path=problem.path, problem=problem.message)
        errors = [p for p in problems if p.severity == "error"]
        if errors:
            raise ConfigError(errors)

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write this config to a TOML, JSON or YAML file (see :func:`omni_trio.load_config`)."""
        save_config(self, path)

    @property
    def entry(self) -> str:
        """The entry stage's name (the first stage unless ``entry_stage`` says otherwise)."""
        return self.entry_stage if self.entry_stage is not None else self.stages[0].name

    @property
    def terminal_stages(self) -> list[str]:
        """Names of the stages with ``terminal=True``, in config order."""
        return [stage.name for stage in self.stages if stage.terminal]

    def stage(self, name: str) -> StageConfig:
        """The config of the stage called ``name``."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


# --------------------------------------------------------------------------- validation


def _unknown(name: object, known: set[str]) -> str | None:
    if not isinstance(name, str):
        return f"stage names are strings, got {type(name).__name__}"
    if name not in known:
        return f"{name!r} is not a stage{did_you_mean(name, known)}"
    return None


def _check_names(path: str, value: object, known: set[str]) -> list[ConfigProblem]:
    problems = []
    if isinstance(value, str):
        message = _unknown(value, known)
        if message:
            problems.append(ConfigProblem(path, message))
    elif isinstance(value, list):
        for index, name in enumerate(value):
            message = _unknown(name, known)
            if message:
                problems.append(ConfigProblem(f"{path}[{index}]", message))
    else:
        problems.append(
            ConfigProblem(path, f"expected a stage name or a list of names, got {type(value).__name__}")
        )
    return problems


def _stage_problems(index: int, stage: StageConfig, known: set[str]) -> list[ConfigProblem]:
    at = f"stages[{index}]"
    problems: list[ConfigProblem] = []
    if not isinstance(stage.name, str) or not stage.name:
        problems.append(ConfigProblem(f"{at}.name", "a stage needs a non-empty string name"))
    for field in ("factory_path", "route_fn", "merge_fn", "wait_for_fn", "stream_done_to_fn"):
        problems += hook_path_problems(f"{at}.{field}", getattr(stage, field))
    if not isinstance(stage.factory, dict):
        problems.append(ConfigProblem(f"{at}.factory", "expected a dict of factory keyword arguments"))
    has_next = stage.next is not None and stage.next != []
    if has_next and stage.terminal:
        problems.append(ConfigProblem(f"{at}", "set either 'next' or 'terminal=True', not both"))
    if not has_next and not stage.terminal:
        problems.append(ConfigProblem(f"{at}", "set 'next' (downstream stages) or 'terminal=True'"))
    if has_next:
        problems += _check_names(f"{at}.next", stage.next, known)
    if stage.route_fn is not None and stage.terminal:
        problems.append(ConfigProblem(f"{at}.route_fn", "a terminal stage routes nowhere; remove route_fn"))
    if stage.wait_for is not None:
        problems += _check_names(f"{at}.wait_for", stage.wait_for, known)
        if not stage.wait_for:
            problems.append(ConfigProblem(f"{at}.wait_for", "an empty fan-in waits for nothing; remove it"))
        if stage.merge_fn is None:
            problems.append(ConfigProblem(f"{at}.merge_fn", "wait_for needs a merge_fn to combine the inputs"))
    elif stage.merge_fn is not None:
        problems.append(ConfigProblem(f"{at}.merge_fn", "merge_fn is only used with wait_for"))
    if stage.wait_for_fn is not None and stage.wait_for is None:
        problems.append(ConfigProblem(f"{at}.wait_for_fn", "wait_for_fn needs wait_for (the static sources)"))
    if not isinstance(stage.project_payload, dict):
        problems.append(ConfigProblem(f"{at}.project_payload", "expected a map of target stage -> dotted path"))
    else:
        for target, hook in stage.project_payload.items():
            message = _unknown(target, known)
            if message:
                problems.append(ConfigProblem(f"{at}.project_payload[{target!r}]", message))
            elif target not in stage.next_stages:
                problems.append(
                    ConfigProblem(f"{at}.project_payload[{target!r}]", f"{target!r} is not in this stage's next")
                )
            problems += hook_path_problems(f"{at}.project_payload[{target!r}]", hook)
    problems += _check_names(f"{at}.stream_to", stage.stream_to, known)
    if stage.stream_done_to_fn is not None and not stage.stream_to:
        problems.append(
            ConfigProblem(f"{at}.stream_done_to_fn", "stream_done_to_fn needs stream_to (the stream targets)")
        )
    if stage.comm is not None and (stage.comm.credits < 1 or stage.comm.slot_size_mb < 1):
        problems.append(ConfigProblem(f"{at}.comm", "credits and slot_size_mb must be at least 1"))
    if stage.comm is not None and not _is_whole(stage.comm.pool_mb, 0):
        problems.append(ConfigProblem(f"{at}.comm", f"pool_mb must be a whole number >= 0, got {stage.comm.pool_mb!r}"))
    problems += _process_problems(f"{at}.process", stage.process)
    if stage.restart not in RESTART_POLICIES:
        problems.append(
            ConfigProblem(f"{at}.restart", f"expected one of {list(RESTART_POLICIES)}, got {stage.restart!r}")
        )
    if not _is_whole(stage.max_restarts, 0):
        problems.append(
            ConfigProblem(f"{at}.max_restarts", f"expected a whole number >= 0, got {stage.max_restarts!r}")
        )
    backoff = stage.restart_backoff_s
    if not isinstance(backoff, (int, float)) or isinstance(backoff, bool) or not 0 <= backoff < float("inf"):
        problems.append(
            ConfigProblem(f"{at}.restart_backoff_s", f"expected a number of seconds >= 0, got {backoff!r}")
        )
    return problems + _replica_problems(at, stage)


def _replica_problems(at: str, stage: StageConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if isinstance(stage.name, str) and REPLICA_SUFFIX.search(stage.name):
        problems.append(ConfigProblem(f"{at}.name", f"{stage.name!r} ends like a replica's name (@r<digits>)"))
    count = stage.replicas
    if not _is_whole(count, 1):
        return [*problems, ConfigProblem(f"{at}.replicas", f"expected a whole number >= 1, got {count!r}")]
    if count > 1 and stage.process is None:
        problems.append(
            ConfigProblem(
                f"{at}.replicas",
                f"replicas={count} needs worker processes: an embedded stage (process=None) runs once, "
                "in the caller's process; set process",
            )
        )
    problems += hook_path_problems(f"{at}.replica_policy", stage.replica_policy)
    overrides = stage.replica_factory
    if overrides is None:
        return problems
    if not isinstance(overrides, list) or len(overrides) != count:
        got = f"{len(overrides)} entries" if isinstance(overrides, list) else type(overrides).__name__
        problems.append(
            ConfigProblem(f"{at}.replica_factory", f"expected a list of {count} dicts (one per replica), got {got}")
        )
        return problems
    for k, entry in enumerate(overrides):
        if not isinstance(entry, dict):
            problems.append(
                ConfigProblem(f"{at}.replica_factory[{k}]", f"expected a dict of factory kwargs, got {entry!r}")
            )
    return problems


def _process_problems(at: str, process: object) -> list[ConfigProblem]:
    if process is None:
        return []
    if process == MAIN_PROCESS:
        message = f"{MAIN_PROCESS!r} is the caller's own process: use process=None to run a stage there"
        return [ConfigProblem(at, message)]
    if not isinstance(process, str) or not _PROCESS_NAME.fullmatch(process):
        return [
            ConfigProblem(
                at,
                f"expected a worker process name of letters, digits, '_', '.' and '-' (up to 64), or None "
                f"for the caller's process, got {process!r}",
            )
        ]
    return []


#: Settings of a whole process group, which its stages must agree on, and what each is called in an error.
_GROUP_FIELDS = {
    "restart": "restart policy",
    "max_restarts": "restart policy",
    "restart_backoff_s": "restart policy",
    "replicas": "replica count (a group is replicated together)",
    "replica_policy": "replica policy",
}


def _group_problems(config: PipelineConfig) -> list[ConfigProblem]:
    """The restart policy and the replicas belong to a process: its stages must not disagree about them."""
    problems: list[ConfigProblem] = []
    first: dict[str, tuple[int, StageConfig]] = {}
    for i, stage in enumerate(config.stages):
        if stage.process is None:
            continue
        if stage.process not in first:
            first[stage.process] = (i, stage)
            continue
        j, other = first[stage.process]
        for field, what in _GROUP_FIELDS.items():
            mine, theirs = getattr(stage, field), getattr(other, field)
            if mine != theirs:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].{field}",
                        f"{field}={mine!r} differs from {field}={theirs!r} of stages[{j}] ({other.name!r}) in "
                        f"the same process {stage.process!r}; all stages of one process share its {what}",
                    )
                )
    return problems


def _admission_problems(config: PipelineConfig) -> list[ConfigProblem]:
    limit = config.max_in_flight
    if limit is None or _is_whole(limit, 1):
        return []
    return [ConfigProblem("max_in_flight", f"expected a whole number >= 1 or None (unlimited), got {limit!r}")]


def _stream_delivery_problems(stream_delivery: StreamDeliveryConfig) -> list[ConfigProblem]:
    backlog = stream_delivery.max_total_backlog_bytes
    if _is_whole(backlog, 1):
        return []
    problem = f"expected a whole number of bytes >= 1, got {backlog!r}"
    return [ConfigProblem("stream_delivery.max_total_backlog_bytes", problem)]


def _endpoints_problems(endpoints: EndpointsConfig) -> list[ConfigProblem]:
    size = endpoints.max_message_bytes
    if _is_whole(size, MIN_MESSAGE_BYTES):
        return []
    return [
        ConfigProblem(
            "endpoints.max_message_bytes",
            f"expected a whole number of bytes >= {MIN_MESSAGE_BYTES} (inline messages must fit), got {size!r}",
        )
    ]


#: The values of ``PipelineConfig.start_method`` (see :mod:`omni_trio.runtime.launch`).
START_METHODS = ("template", "spawn")


def _start_method_problems(config: PipelineConfig) -> list[ConfigProblem]:
    if config.start_method in START_METHODS:
        return []
    return [ConfigProblem(
        "start_method",
        f"expected 'template' (fork workers from one preloaded process, the default) or 'spawn' "
        f"(a fresh interpreter per worker), got {config.start_method!r}",
    )]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_whole(value: object, minimum: int) -> bool:
    # bool is an int subclass, but a count of True is surely a mistake.
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _serve_problems(serve: object) -> list[ConfigProblem]:
    if serve is None:
        return []
    if not isinstance(serve, ServeConfig):
        return [ConfigProblem("serve", f"expected a ServeConfig, got {type(serve).__name__}")]
    problems = []
    if not isinstance(serve.model, str) or not serve.model:
        problems.append(ConfigProblem("serve.model", f"expected a non-empty model id, got {serve.model!r}"))
    problems += hook_path_problems("serve.adapter", serve.adapter)
    if not isinstance(serve.adapter_options, dict):
        problems.append(ConfigProblem("serve.adapter_options", "expected a table of keyword arguments"))
    body = serve.max_body_bytes
    if not _is_whole(body, 1):
        problems.append(ConfigProblem("serve.max_body_bytes", f"expected a whole number >= 1, got {body!r}"))
    if not _is_number(serve.grace_period_s) or serve.grace_period_s < 0:
        problems.append(ConfigProblem("serve.grace_period_s", f"expected seconds >= 0, got {serve.grace_period_s!r}"))
    if serve.deadline_s is not None and (not _is_number(serve.deadline_s) or serve.deadline_s <= 0):
        problems.append(ConfigProblem("serve.deadline_s", f"expected seconds > 0 or None, got {serve.deadline_s!r}"))
    retry = serve.retry_after_s
    if not _is_whole(retry, 0):
        problems.append(ConfigProblem("serve.retry_after_s", f"expected a whole number >= 0, got {retry!r}"))
    return problems


def _graph_problems(config: PipelineConfig, known: set[str]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    index_of = {stage.name: i for i, stage in enumerate(config.stages)}
    edges = {
        stage.name: [n for n in stage.next_stages + stage.stream_to if n in known] for stage in config.stages
    }
    for i, stage in enumerate(config.stages):
        for j, source in enumerate(stage.wait_for or []):
            if source in known and stage.name not in config.stage(source).next_stages:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].wait_for[{j}]",
                        f"{source!r} does not route to {stage.name!r}; add it to {source!r}'s next",
                    )
                )
        for target in stage.stream_to:
            if target in known and not config.stage(target).can_accept_stream_before_payload:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].stream_to",
                        f"{target!r} may receive chunks before its payload; "
                        "set can_accept_stream_before_payload=True on it",
                        severity="warning",
                    )
                )
    entry = config.entry
    if entry not in known:
        problems.append(ConfigProblem("entry_stage", f"{entry!r} is not a stage{did_you_mean(entry, known)}"))
        return problems
    reachable, frontier = {entry}, [entry]
    while frontier:
        for target in edges[frontier.pop()]:
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    for stage in config.stages:
        if stage.name not in reachable:
            problems.append(
                ConfigProblem(f"stages[{index_of[stage.name]}]", f"{stage.name!r} is unreachable from {entry!r}")
            )
    if not any(config.stage(name).terminal for name in reachable):
        problems.append(ConfigProblem("stages", f"no terminal stage is reachable from {entry!r}"))
    problems += _cycle_problems(config, known)
    return problems


def _cycle_problems(config: PipelineConfig, known: set[str]) -> list[ConfigProblem]:
    # A stage routing to itself is allowed (iterative stages); longer cycles are not.
    successors = {s.name: [n for n in s.next_stages if n in known and n != s.name] for s in config.stages}
    state: dict[str, int] = {}
    problems: list[ConfigProblem] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in successors[name]:
            if state.get(target) == 1:
                cycle = [*trail[trail.index(target) :], target]
                problems.append(ConfigProblem("stages", f"cycle through next: {' -> '.join(cycle)}"))
            elif target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for stage in config.stages:
        if stage.name not in state:
            visit(stage.name, [stage.name])
    return problems


def process_edges(config: PipelineConfig) -> list[tuple[str, str, str, str]]:
    """``(path, from process, to process, to stage)`` of every edge between stages (``next``, ``stream_to``)."""
    process = {s.name: s.process or MAIN_PROCESS for s in config.stages}
    return [
        (f"stages[{i}].{field}", process[s.name], process[target], target)
        for i, s in enumerate(config.stages)
        for field, targets in (("next", s.next_stages), ("stream_to", s.stream_to))
        for target in targets
        if target in process
    ]


def validate(config: PipelineConfig) -> list[ConfigProblem]:
    """Every problem in ``config``'s structure (names, edges, graph), errors and warnings."""
    problems: list[ConfigProblem] = []
    if not config.stages:
        return [ConfigProblem("stages", "a pipeline needs at least one stage")]
    names: list[str] = []
    for i, stage in enumerate(config.stages):
        if not isinstance(stage, StageConfig):
            problems.append(ConfigProblem(f"stages[{i}]", f"expected a StageConfig, got {type(stage).__name__}"))
            continue
        if stage.name in names:
            problems.append(ConfigProblem(f"stages[{i}].name", f"duplicate stage name {stage.name!r}"))
        names.append(stage.name)
    if problems:
        return problems
    known = set(names)
    for i, stage in enumerate(config.stages):
        problems += _stage_problems(i, stage, known)
    problems += hook_path_problems("terminal_stages_fn", config.terminal_stages_fn)
    problems += _group_problems(config)
    problems += hook_path_problems("replica_policy", config.replica_policy)
    problems += _admission_problems(config)
    problems += _stream_delivery_problems(config.stream_delivery)
    problems += _endpoints_problems(config.endpoints)
    problems += _start_method_problems(config)
    problems += _serve_problems(config.serve)
    groups = {s.process: {"replicas": s.replicas} for s in config.stages if s.process}
    problems += processes_problems(config.processes, groups)
    problems += _graph_problems(config, known)
    return problems


# --------------------------------------------------------------------------- imports


def check_imports(config: PipelineConfig) -> None:
    """Import every hook and factory of ``config``; raise ConfigError listing all failures."""
    problems: list[ConfigProblem] = []
    for i, stage in enumerate(config.stages):
        at = f"stages[{i}]"
        factory, problem = import_problem(f"{at}.factory_path", stage.factory_path)
        if problem:
            problems.append(problem)
        else:
            problems += factory_kwarg_problems(f"{at}.factory", factory, stage.factory)
            for k, entry in enumerate(stage.replica_factory or []):
                problems += factory_kwarg_problems(f"{at}.replica_factory[{k}]", factory, entry)
        for field in ("route_fn", "merge_fn", "wait_for_fn", "stream_done_to_fn", "replica_policy"):
            value = getattr(stage, field)
            if value is not None:
                problems += [p for p in [import_problem(f"{at}.{field}", value)[1]] if p]
        for target, hook in stage.project_payload.items():
            problems += [p for p in [import_problem(f"{at}.project_payload[{target!r}]", hook)[1]] if p]
    for field in ("terminal_stages_fn", "replica_policy"):
        value = getattr(config, field)
        if value is not None:
            problems += [p for p in [import_problem(field, value)[1]] if p]
    if config.serve is not None:
        adapter, problem = import_problem("serve.adapter", config.serve.adapter)
        if problem:
            problems.append(problem)
        else:
            problems += factory_kwarg_problems("serve.adapter_options", adapter, config.serve.adapter_options)
    if problems:
        raise ConfigError(problems)
