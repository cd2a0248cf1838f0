"""Validation of what once passed and failed later: factories in the ``__main__`` script placed in worker
processes, and scheduler options out of range."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omni_trio as ot

ROOT = Path(__file__).resolve().parents[2]


def problems_of(*stages: ot.StageConfig) -> list[str]:
    with pytest.raises(ot.ConfigError) as info:
        ot.PipelineConfig(stages=list(stages))
    return [str(problem) for problem in info.value.problems]


def test_main_script_hooks_are_refused_for_stages_in_worker_processes() -> None:
    problems = problems_of(
        ot.StageConfig(name="a", factory_path="__main__.create", process="p_a", next="b",
                       route_fn="__main__.route"),
        ot.StageConfig(name="b", factory_path="tests.stages.create_passthrough", terminal=True),
    )
    assert problems == [
        "stages[0].factory_path: '__main__.create' is defined in the __main__ script, which worker process "
        "'p_a' cannot import: define it in an importable module",
        "stages[0].route_fn: '__main__.route' is defined in the __main__ script, which worker process "
        "'p_a' cannot import: define it in an importable module",
    ]
    # Embedded stages run in the script's own process: they may keep them.
    ot.PipelineConfig(stages=[ot.StageConfig(name="a", factory_path="__main__.create", terminal=True)])


SCRIPT = """
import trio
import omni_trio as ot
from omni_trio.scheduling import SimpleScheduler

def create():
    return SimpleScheduler(lambda payload: payload)

async def main():
    config = ot.PipelineConfig(stages=[ot.StageConfig(name="a", factory_path=create, process="p_a", terminal=True)])
    async with ot.open_pipeline(config) as pipeline:
        await pipeline.submit("r", "x")

try:
    trio.run(main)
except ot.ConfigError as error:
    print(error.problems[0])
"""


def test_a_script_placing_its_own_factory_in_a_worker_is_told_at_once(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        "stages[0].factory_path: '__main__.create' is defined in the __main__ script, which worker process "
        "'p_a' cannot import: define it in an importable module\n"
    )


def test_scheduler_options_out_of_range_are_listed_with_their_paths() -> None:
    problems = problems_of(
        ot.StageConfig(name="a", factory_path="m.create", next="b",
                       factory={"max_batch_size": -3, "max_batch_wait_ms": -1.0, "max_concurrency": 0,
                                "max_pending": 0, "other": -5}),
        ot.StageConfig(name="b", factory_path="m.create", terminal=True, process="p_b", replicas=2,
                       factory={"max_batch_size": 0, "max_pending": None, "max_batch_wait_ms": 2.5},
                       replica_factory=[{"max_queued_streams": True}, {"max_batch_wait_ms": float("nan")}]),
    )
    assert problems == [
        "stages[0].factory['max_batch_size']: max_batch_size must be a whole number >= 1, got -3",
        "stages[0].factory['max_batch_wait_ms']: max_batch_wait_ms must be a number >= 0, got -1.0",
        "stages[0].factory['max_concurrency']: max_concurrency must be None or a whole number >= 1, got 0",
        "stages[0].factory['max_pending']: max_pending must be None or a whole number >= 1, got 0",
        "stages[1].factory['max_batch_size']: max_batch_size must be a whole number >= 1, got 0",
        "stages[1].replica_factory[0]['max_queued_streams']: max_queued_streams must be None or a whole number "
        ">= 1, got True",
        "stages[1].replica_factory[1]['max_batch_wait_ms']: max_batch_wait_ms must be a number >= 0, got nan",
    ]
