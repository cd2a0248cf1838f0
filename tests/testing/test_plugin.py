"""The user-facing pytest plugin (omni_trio.testing): placements, the idle check, the fixtures."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.testing import PLACEMENTS, pipeline_for, placed

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
M = "examples.ch4_fanin_stages"

FANIN: dict[str, Any] = {
    "entry_stage": "split",
    "stages": [
        {"name": "split", "factory_path": f"{M}.create_split", "next": ["upper", "count"],
         "project_payload": {"upper": f"{M}.project_to_upper", "count": f"{M}.project_to_count"}},
        {"name": "upper", "factory_path": f"{M}.create_upper", "next": "join"},
        {"name": "count", "factory_path": f"{M}.create_count", "next": "join"},
        {"name": "join", "factory_path": f"{M}.create_join", "wait_for": ["upper", "count"],
         "merge_fn": f"{M}.merge", "terminal": True},
    ],
}

USER_TESTS = f"""
    import pytest

    FANIN = {FANIN!r}


    @pytest.mark.trio
    @pytest.mark.parametrize("omni_placement", ["embedded"], indirect=True)
    async def test_fan_in(open_omni_pipeline, omni_placement):
        async with open_omni_pipeline(FANIN) as pipeline:
            result = await pipeline.submit("r0", "hello omni world")
        assert omni_placement == "embedded"
        assert result["upper"] == "HELLO OMNI WORLD" and result["count"] == 3


    def test_every_selected_placement(omni_placement):
        assert omni_placement in ("embedded", "processes", "mixed")
"""


def run_user_tests(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.syspathinsert(ROOT)
    pytester.makepyfile(test_user=textwrap.dedent(USER_TESTS))
    return pytester.runpytest("--rootdir", str(pytester.path), "-p", "no:cacheprovider", "-v", *args)


def test_a_user_test_file_runs_with_the_fixtures(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "*test_fan_in[[]embedded[]] PASSED*",
            "*test_every_selected_placement[[]embedded[]] PASSED*",
            "*test_every_selected_placement[[]processes[]] PASSED*",
            "*test_every_selected_placement[[]mixed[]] PASSED*",
        ]
    )


def test_the_command_line_restricts_the_placements(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, "--omni-placements", "mixed,embedded")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_every_selected_placement[[]mixed[]] PASSED*"])
    assert "[processes]" not in result.stdout.str()


def test_an_unknown_placement_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, "--omni-placements", "cloud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown placement(s) [[]'cloud'[]]*"])


def test_placed_sets_each_stage_process() -> None:
    processes = {placement: [s.process for s in placed(FANIN, placement).stages] for placement in PLACEMENTS}
    assert processes == {
        "embedded": [None, None, None, None],
        "processes": ["p_split", "p_upper", "p_count", "p_join"],
        "mixed": [None, "group_b", "group_a", "group_b"],
    }
    config = placed(FANIN, "processes")
    assert isinstance(config, ot.PipelineConfig) and config.entry == "split"
    # A PipelineConfig is re-placed: existing process values are replaced.
    assert [s.process for s in placed(config, "embedded").stages] == [None] * 4
    with pytest.raises(ValueError, match="unknown placement 'cloud'"):
        placed(FANIN, "cloud")
    with pytest.raises(ot.ConfigError, match="unknown key"):
        placed({**FANIN, "colour": "red"}, "embedded")


async def test_pipeline_for_checks_the_pipeline_is_idle_at_the_end() -> None:
    async with pipeline_for(FANIN, trace=None, timeout=30) as pipeline:
        assert (await pipeline.submit("r0", "stage by stage"))["count"] == 3


async def test_a_request_left_live_fails_the_idle_check() -> None:
    config = {"stages": [{"name": "slow", "factory_path": "tests.stages.create_block_until_aborted", "terminal": True}]}
    outcome: list[BaseException] = []

    async def submit(pipeline: ot.Pipeline) -> None:
        try:
            await pipeline.submit("left-live", "x")
        except ot.RequestAborted as exc:
            outcome.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            with pytest.raises(AssertionError) as info:
                async with pipeline_for(config) as pipeline:
                    nursery.start_soon(submit, pipeline)
                    while (await pipeline.stats()).live_requests == 0:
                        await trio.testing.wait_all_tasks_blocked()
    message = str(info.value)
    assert "not idle" in message and "live_requests=1" in message and "slow.active_requests=1" in message
    # Closing the pipeline aborted the request it found live.
    assert len(outcome) == 1 and isinstance(outcome[0], ot.RequestAborted)


async def test_an_error_in_the_block_skips_the_idle_check() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with pipeline_for(FANIN):
            raise KeyError("mine")


def create_slow_factory() -> ot.SimpleScheduler:
    """A factory that takes 0.5 s (it blocks the caller's loop: the start-up deadline fires after it)."""
    time.sleep(0.5)
    return ot.SimpleScheduler(lambda payload: payload)


async def test_a_slow_start_raises_too_slow() -> None:
    config = {"stages": [{"name": "slow", "factory_path": f"{__name__}.create_slow_factory", "terminal": True}]}
    with pytest.raises(trio.TooSlowError, match=r"did not start within 0\.2 s"):
        async with pipeline_for(config, timeout=0.2):
            pass
