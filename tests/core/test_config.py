"""Configuration errors are reported all at once, each with its path."""

from __future__ import annotations

import pytest
import trio

import omni_trio as ot
from tests.placement import stage


def problems_of(**kwargs: object) -> list[str]:
    with pytest.raises(ot.ConfigError) as info:
        ot.PipelineConfig(**kwargs)  # type: ignore[arg-type]
    return [str(problem) for problem in info.value.problems]


def test_every_problem_is_listed_with_its_path() -> None:
    problems = problems_of(
        entry_stage="split",
        stages=[
            stage("split", "create_append", next=["upper", "cuont"], project_payload={"uper": "m.f"}),
            stage("upper", "create_append", next="join", terminal=True),
            stage("count", "create_append"),
            stage("join", "create_passthrough", wait_for=["upper", "count"], terminal=True,
                  route_fn="tests.stages.route_by_words", wait_for_fn="tests.stages.wait_by_words",
                  stream_done_to_fn="tests.stages.route_by_words"),
        ],
    )
    assert "stages[0].next[1]: 'cuont' is not a stage; did you mean 'count'?" in problems
    assert "stages[0].project_payload['uper']: 'uper' is not a stage; did you mean 'upper'?" in problems
    assert "stages[1]: set either 'next' or 'terminal=True', not both" in problems
    assert "stages[2]: set 'next' (downstream stages) or 'terminal=True'" in problems
    assert "stages[3].route_fn: a terminal stage routes nowhere; remove route_fn" in problems
    assert "stages[3].merge_fn: wait_for needs a merge_fn to combine the inputs" in problems
    assert "stages[3].stream_done_to_fn: stream_done_to_fn needs stream_to (the stream targets)" in problems
    assert "stages[3].wait_for[1]: 'count' does not route to 'join'; add it to 'count''s next" in problems


def test_duplicate_names_unknown_entry_and_cycles() -> None:
    assert problems_of(stages=[stage("a", "f", terminal=True), stage("a", "f", terminal=True)]) == [
        "stages[1].name: duplicate stage name 'a'"
    ]
    assert "entry_stage: 'splt' is not a stage; did you mean 'split'?" in problems_of(
        entry_stage="splt", stages=[stage("split", "f", terminal=True)]
    )
    cycle = problems_of(
        stages=[stage("a", "f", next="b"), stage("b", "f", next="a"), stage("t", "f", terminal=True)]
    )
    assert "stages: cycle through next: a -> b -> a" in cycle
    assert "stages[2]: 't' is unreachable from 'a'" in cycle
    assert "stages: no terminal stage is reachable from 'a'" in cycle


def test_process_names_name_files_and_main_is_the_callers() -> None:
    problems = problems_of(
        stages=[
            stage("a", "f", process="main", next="b"),
            stage("b", "f", process="../p", next="c"),
            stage("c", "f", process="p_ok", terminal=True),
        ]
    )
    assert problems == [
        "stages[0].process: 'main' is the caller's own process: use process=None to run a stage there",
        "stages[1].process: expected a worker process name of letters, digits, '_', '.' and '-' (up to 64), "
        "or None for the caller's process, got '../p'",
    ]


@pytest.mark.parametrize("bad", [0, 65535, -1, True, 1.5, "64MiB", None])
def test_the_message_size_cap_must_let_inline_messages_through(bad: object) -> None:
    endpoints = ot.EndpointsConfig(max_message_bytes=bad)  # type: ignore[arg-type]
    assert problems_of(stages=[stage("a", "f", terminal=True)], endpoints=endpoints) == [
        "endpoints.max_message_bytes: expected a whole number of bytes >= 65536 (inline messages must fit), "
        f"got {bad!r}"
    ]
    assert ot.EndpointsConfig().max_message_bytes == 64 << 20
    ot.PipelineConfig(stages=[stage("a", "f", terminal=True)], endpoints=ot.EndpointsConfig(max_message_bytes=65536))


def test_hooks_must_be_importable_names() -> None:
    problems = problems_of(stages=[ot.StageConfig(name="a", factory_path=lambda: None, terminal=True)])
    assert len(problems) == 1 and problems[0].startswith("stages[0].factory_path:")
    assert "cannot be imported by name" in problems[0]


def test_module_level_functions_become_dotted_paths() -> None:
    from tests import stages

    config = ot.StageConfig(name="a", factory_path=stages.create_passthrough, terminal=True)
    assert config.factory_path == "tests.stages.create_passthrough"


async def test_imports_and_factory_arguments_are_checked_when_the_pipeline_opens() -> None:
    config = ot.PipelineConfig(
        stages=[
            stage("a", "create_append", factory={"tga": "x"}, next="b", route_fn="tests.stages.no_such_fn"),
            stage("b", "no_such_factory", terminal=True),
        ]
    )
    with trio.fail_after(10), pytest.raises(ot.ConfigError) as info:
        async with ot.open_pipeline(config):
            pass
    problems = [str(p) for p in info.value.problems]
    assert "stages[0].factory['tga']: the factory does not accept 'tga'; did you mean 'tag'?" in problems
    assert any(p.startswith("stages[0].route_fn: cannot import 'tests.stages.no_such_fn'") for p in problems)
    assert any(p.startswith("stages[1].factory_path: cannot import 'tests.stages.no_such_factory'") for p in problems)


def test_a_porting_field_without_effect_is_named_once_at_load() -> None:
    from omni_trio.config.pipeline import validate

    config = ot.PipelineConfig(
        stages=[
            stage("a", "create_append", next="b", disable_direct_cuda_ipc_payload=True),
            stage("b", "create_append", terminal=True, disable_direct_cuda_ipc_payload=True),
        ]
    )
    warned = [problem for problem in validate(config) if problem.severity == "warning"]
    assert [problem.path for problem in warned] == ["stages[0].disable_direct_cuda_ipc_payload"]
    assert "(and 1 more stage(s)) is accepted for porting and has no effect" in warned[0].message
    unset = ot.PipelineConfig(stages=[stage("a", "create_append", terminal=True)])
    assert [problem for problem in validate(unset) if problem.severity == "warning"] == []
