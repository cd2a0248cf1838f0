"""The checks behind :class:`~omni_trio.config.PipelineConfig`'s validation of its stages, each
returning every problem of its part with the problem's path: the stage list, each stage, the process
groups and the graph (the pipeline-wide settings' checks are :mod:`omni_trio.config.setting_checks`).
``PipelineConfig`` runs them all on construction (:func:`~omni_trio.config.pipeline.validate`);
whether hooks import is :func:`~omni_trio.config.check_imports`' job, when a pipeline opens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from omni_trio.config.hooks import did_you_mean, hook_path_problems, scheduler_option_problems
from omni_trio.config.processes import RESTART_FIELDS, ProcessConfig, restart_problems
from omni_trio.config.setting_checks import is_whole
from omni_trio.config.stages import MAIN_PROCESS, REPLICA_SUFFIX, StageConfig
from omni_trio.errors import ConfigProblem

# A worker's name names its socket and spec files: one plain path component.
_PROCESS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def stage_list_problems(stages: Sequence[object]) -> list[ConfigProblem]:
    """What makes ``stages`` unfit for the other checks: none at all, an entry that is not a
    :class:`StageConfig`, a name given twice."""
    if not stages:
        return [ConfigProblem("stages", "a pipeline needs at least one stage")]
    problems: list[ConfigProblem] = []
    names: set[str] = set()
    for i, stage in enumerate(stages):
        if not isinstance(stage, StageConfig):
            problems.append(ConfigProblem(f"stages[{i}]", f"expected a StageConfig, got {type(stage).__name__}"))
            continue
        if stage.name in names:
            problems.append(ConfigProblem(f"stages[{i}].name", f"duplicate stage name {stage.name!r}"))
        names.add(stage.name)
    return problems


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


def stage_problems(index: int, stage: StageConfig, known: set[str]) -> list[ConfigProblem]:
    """The problems of ``stages[index]`` alone (``known``: every stage name, for its edges), with their paths."""
    at = f"stages[{index}]"
    problems: list[ConfigProblem] = []
    if not isinstance(stage.name, str) or not stage.name:
        problems.append(ConfigProblem(f"{at}.name", "a stage needs a non-empty string name"))
    for field in ("factory_path", "route_fn", "merge_fn", "wait_for_fn", "stream_done_to_fn"):
        problems += hook_path_problems(f"{at}.{field}", getattr(stage, field), stage.process)
    if not isinstance(stage.factory, dict):
        problems.append(ConfigProblem(f"{at}.factory", "expected a dict of factory keyword arguments"))
    problems += scheduler_option_problems(f"{at}.factory", stage.factory)
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
            problems += hook_path_problems(f"{at}.project_payload[{target!r}]", hook, stage.process)
    problems += _check_names(f"{at}.stream_to", stage.stream_to, known)
    if stage.stream_done_to_fn is not None and not stage.stream_to:
        problems.append(
            ConfigProblem(f"{at}.stream_done_to_fn", "stream_done_to_fn needs stream_to (the stream targets)")
        )
    if stage.comm is not None and (stage.comm.credits < 1 or stage.comm.slot_size_mb < 1):
        problems.append(ConfigProblem(f"{at}.comm", "credits and slot_size_mb must be at least 1"))
    if stage.comm is not None and not is_whole(stage.comm.pool_mb, 0):
        problems.append(ConfigProblem(f"{at}.comm", f"pool_mb must be a whole number >= 0, got {stage.comm.pool_mb!r}"))
    problems += _process_problems(f"{at}.process", stage.process)
    problems += restart_problems(at, stage.restart, stage.max_restarts, stage.restart_backoff_s)
    return problems + _replica_problems(at, stage)


def _replica_problems(at: str, stage: StageConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    if isinstance(stage.name, str) and REPLICA_SUFFIX.search(stage.name):
        problems.append(ConfigProblem(f"{at}.name", f"{stage.name!r} ends like a replica's name (@r<digits>)"))
    count = stage.replicas
    if not is_whole(count, 1):
        return [*problems, ConfigProblem(f"{at}.replicas", f"expected a whole number >= 1, got {count!r}")]
    if count > 1 and stage.process is None:
        problems.append(
            ConfigProblem(
                f"{at}.replicas",
                f"replicas={count} needs worker processes: an embedded stage (process=None) runs once, "
                "in the caller's process; set process",
            )
        )
    problems += hook_path_problems(f"{at}.replica_policy", stage.replica_policy, stage.process)
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
        problems += scheduler_option_problems(f"{at}.replica_factory[{k}]", entry)
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


def group_problems(stages: list[StageConfig]) -> list[ConfigProblem]:
    """The restart policy and the replicas belong to a process: its stages must not disagree about them."""
    problems: list[ConfigProblem] = []
    first: dict[str, tuple[int, StageConfig]] = {}
    for i, stage in enumerate(stages):
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


def moved_restart_problems(stages: list[StageConfig], processes: object) -> list[ConfigProblem]:
    """A stage's (deprecated) restart setting that contradicts its process's own, non-default one."""
    if not isinstance(processes, dict):
        return []
    default = ProcessConfig()
    problems: list[ConfigProblem] = []
    for i, stage in enumerate(stages):
        entry = processes.get(stage.process) if stage.process is not None else None
        if not isinstance(entry, ProcessConfig):
            continue
        for field in RESTART_FIELDS:
            mine, theirs = getattr(stage, field), getattr(entry, field)
            if mine is not None and theirs != getattr(default, field) and mine != theirs:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].{field}",
                        f"{field}={mine!r} differs from processes[{stage.process!r}].{field}={theirs!r}; "
                        f"set it once, on the process",
                    )
                )
    return problems


#: Fields kept for porting from SGLang-Omni that change nothing here, and why.
NO_EFFECT = {
    "disable_direct_cuda_ipc_payload": (
        "accepted for porting and has no effect: omni-trio has no direct CUDA IPC payload path to disable "
        "(tensors travel through shared memory)"
    ),
}


def no_effect_problems(stages: list[StageConfig]) -> list[ConfigProblem]:
    """One warning per porting field that some stage sets and that has no effect here, at the first
    stage that sets it."""
    problems: list[ConfigProblem] = []
    for field, why in NO_EFFECT.items():
        setting = [i for i, stage in enumerate(stages) if getattr(stage, field)]
        if setting:
            others = f" (and {len(setting) - 1} more stage(s))" if len(setting) > 1 else ""
            problems.append(ConfigProblem(f"stages[{setting[0]}].{field}", f"{field}{others} is {why}",
                                          severity="warning"))
    return problems


def graph_problems(stages: list[StageConfig], entry: str) -> list[ConfigProblem]:
    """The problems of the stage graph as a whole: fan-in sources that do not route to their stage,
    stream targets that cannot take chunks before their payload (a warning), the entry stage, stages
    it cannot reach, no reachable terminal stage, cycles."""
    problems: list[ConfigProblem] = []
    by_name = {stage.name: stage for stage in stages}
    known = set(by_name)
    index_of = {stage.name: i for i, stage in enumerate(stages)}
    edges = {stage.name: [n for n in stage.next_stages + stage.stream_to if n in known] for stage in stages}
    for i, stage in enumerate(stages):
        for j, source in enumerate(stage.wait_for or []):
            if source in known and stage.name not in by_name[source].next_stages:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].wait_for[{j}]",
                        f"{source!r} does not route to {stage.name!r}; add it to {source!r}'s next",
                    )
                )
        for target in stage.stream_to:
            if target in known and not by_name[target].can_accept_stream_before_payload:
                problems.append(
                    ConfigProblem(
                        f"stages[{i}].stream_to",
                        f"{target!r} may receive chunks before its payload; "
                        "set can_accept_stream_before_payload=True on it",
                        severity="warning",
                    )
                )
    if entry not in known:
        problems.append(ConfigProblem("entry_stage", f"{entry!r} is not a stage{did_you_mean(entry, known)}"))
        return problems
    reachable, frontier = {entry}, [entry]
    while frontier:
        for target in edges[frontier.pop()]:
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    for stage in stages:
        if stage.name not in reachable:
            problems.append(
                ConfigProblem(f"stages[{index_of[stage.name]}]", f"{stage.name!r} is unreachable from {entry!r}")
            )
    if not any(by_name[name].terminal for name in reachable):
        problems.append(ConfigProblem("stages", f"no terminal stage is reachable from {entry!r}"))
    problems += _cycle_problems(stages, known)
    return problems


def _cycle_problems(stages: list[StageConfig], known: set[str]) -> list[ConfigProblem]:
    # A stage routing to itself is allowed (iterative stages); longer cycles are not.
    successors = {s.name: [n for n in s.next_stages if n in known and n != s.name] for s in stages}
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

    for stage in stages:
        if stage.name not in state:
            visit(stage.name, [stage.name])
    return problems
