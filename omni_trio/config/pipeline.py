"""The whole pipeline's config, :class:`PipelineConfig`, validated on construction; what its stages'
edges cross between processes (:func:`process_edges`); whether its hooks import (:func:`check_imports`).
"""

from __future__ import annotations

import os

import attrs

from omni_trio.config import checks, setting_checks
from omni_trio.config.hooks import factory_kwarg_problems, hook_path_problems, import_problem
from omni_trio.config.processes import RESTART_FIELDS, ProcessConfig, processes_problems
from omni_trio.config.save import save_config
from omni_trio.config.settings import EndpointsConfig, ServeConfig, StreamAdmissionConfig, StreamDeliveryConfig
from omni_trio.config.stages import MAIN_PROCESS, StageConfig, name_list, optional_dotted
from omni_trio.errors import ConfigError, ConfigProblem
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)


@attrs.frozen
class PipelineConfig:
    """A whole pipeline. Validated on construction (see :func:`validate`).

    ``start_method`` says how worker processes start: ``"template"`` (the
    default: one preloaded template process per pipeline forks them, so N
    workers cost about one import of torch and the stage modules) or
    ``"spawn"`` (a fresh interpreter per worker; for stage modules that must
    be imported in every process on their own). See :mod:`omni_trio.runtime.workers.launch`.
    """

    stages: list[StageConfig] = attrs.field(converter=name_list)
    entry_stage: str | None = None
    model_path: str | None = None
    name: str | None = None
    terminal_stages_fn: str | None = attrs.field(default=None, converter=optional_dotted)
    endpoints: EndpointsConfig = attrs.field(factory=EndpointsConfig)
    stream_delivery: StreamDeliveryConfig = attrs.field(factory=StreamDeliveryConfig)
    #: When a new streaming request is refused to keep the admitted streams real-time (adaptive by default).
    stream_admission: StreamAdmissionConfig = attrs.field(factory=StreamAdmissionConfig)
    max_in_flight: int | None = None
    replica_policy: str | None = attrs.field(default=None, converter=optional_dotted)
    serve: ServeConfig | None = None
    start_method: str = "template"
    #: Where process groups run (see :mod:`omni_trio.config.processes`); a group not listed is a local child.
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

    def process(self, name: str) -> ProcessConfig:
        """The settings of process ``name`` (a group's, or a replica's: ``p@r1`` is ``p``'s): its entry
        in ``processes`` (or the defaults), with the restart policy its stages still carry (deprecated)."""
        group = name.split("@r", 1)[0]
        entry = self.processes.get(group, ProcessConfig())
        moved = {
            field: value
            for stage in self.stages
            if stage.process == group
            for field in RESTART_FIELDS
            if (value := getattr(stage, field)) is not None
        }
        return attrs.evolve(entry, **moved) if moved else entry

    def stage(self, name: str) -> StageConfig:
        """The config of the stage called ``name``."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


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
    """Every problem in ``config``'s structure (names, edges, graph, settings), errors and warnings."""
    problems = checks.stage_list_problems(config.stages)
    if problems:
        return problems
    known = {stage.name for stage in config.stages}
    for i, stage in enumerate(config.stages):
        problems += checks.stage_problems(i, stage, known)
    problems += hook_path_problems("terminal_stages_fn", config.terminal_stages_fn)
    problems += checks.group_problems(config.stages)
    problems += hook_path_problems("replica_policy", config.replica_policy)
    problems += setting_checks.admission_problems(config.max_in_flight)
    problems += setting_checks.stream_delivery_problems(config.stream_delivery)
    problems += setting_checks.stream_admission_problems(config.stream_admission)
    problems += setting_checks.endpoints_problems(config.endpoints)
    problems += setting_checks.start_method_problems(config.start_method)
    problems += setting_checks.serve_problems(config.serve)
    groups = {s.process: {"replicas": s.replicas} for s in config.stages if s.process}
    problems += processes_problems(config.processes, groups)
    problems += checks.moved_restart_problems(config.stages, config.processes)
    problems += checks.no_effect_problems(config.stages)
    problems += checks.graph_problems(config.stages, config.entry)
    return problems


def stage_import_problems(index: int, stage: StageConfig) -> list[ConfigProblem]:
    """Why the factory and hooks of ``stages[index]`` do not import, and factory kwargs it cannot take."""
    at = f"stages[{index}]"
    problems: list[ConfigProblem] = []
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
    return problems


def settings_import_problems(
    terminal_stages_fn: str | None, replica_policy: str | None, serve: ServeConfig | None
) -> list[ConfigProblem]:
    """Why the pipeline-wide hooks and the serve adapter do not import (or cannot take its options)."""
    problems: list[ConfigProblem] = []
    for field, value in (("terminal_stages_fn", terminal_stages_fn), ("replica_policy", replica_policy)):
        if value is not None:
            problems += [p for p in [import_problem(field, value)[1]] if p]
    if serve is not None:
        adapter, problem = import_problem("serve.adapter", serve.adapter)
        if problem:
            problems.append(problem)
        else:
            problems += factory_kwarg_problems("serve.adapter_options", adapter, serve.adapter_options)
    return problems


def check_imports(config: PipelineConfig) -> None:
    """Import every hook and factory of ``config``; raise ConfigError listing all failures."""
    problems = [problem for i, stage in enumerate(config.stages) for problem in stage_import_problems(i, stage)]
    problems += settings_import_problems(config.terminal_stages_fn, config.replica_policy, config.serve)
    if problems:
        raise ConfigError(problems)
