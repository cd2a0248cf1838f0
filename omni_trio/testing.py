"""Test helpers and a pytest plugin for pipelines built on omni-trio.

The plugin is registered as a ``pytest11`` entry point, so installing
omni-trio makes its fixtures available in every pytest session:

* ``omni_placement``: the placement of the current test, one of
  :data:`PLACEMENTS`; a test that uses it (directly or through
  ``open_omni_pipeline``) runs once per placement. Restrict it with
  ``--omni-placements embedded,mixed`` on the command line, or per test with
  ``@pytest.mark.parametrize("omni_placement", ["embedded"], indirect=True)``.
* ``open_omni_pipeline``: a factory; ``async with open_omni_pipeline(config)
  as pipeline:`` opens ``config`` in the current placement (see
  :func:`pipeline_for`).

Without pytest, :func:`placed` and :func:`pipeline_for` work on their own.
This module loads in every pytest session, so it imports nothing heavy at
import time (no torch, and omni-trio's runtime only when a helper runs).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from omni_trio.config import PipelineConfig, StageConfig
    from omni_trio.coordinator.pipeline import Pipeline
    from omni_trio.coordinator.stats import PipelineStats

#: ``embedded``: every stage in the caller's process (``process=None``);
#: ``processes``: each stage in a worker process of its own, ``p_<stage name>``;
#: ``mixed``: the first stage in the caller's process, the others alternating
#: between two shared worker processes (``group_b``, ``group_a``, ``group_b``, ...).
PLACEMENTS: tuple[str, ...] = ("embedded", "processes", "mixed")

#: The worker processes the ``mixed`` placement shares between the stages after the first.
MIXED_PROCESSES = ("group_a", "group_b")

#: How long :func:`pipeline_for` lets a pipeline take to start, by default (seconds).
DEFAULT_TIMEOUT_S = 60.0


def process_for(index: int, name: str, placement: str) -> str | None:
    """The ``process`` value of the ``index``-th stage (called ``name``) in ``placement``."""
    if placement == "embedded":
        return None
    if placement == "processes":
        return f"p_{name}"
    if placement == "mixed":
        return None if index == 0 else MIXED_PROCESSES[index % 2]
    raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")


def place_stages(stages: Sequence[StageConfig], placement: str) -> list[StageConfig]:
    """``stages`` with ``process`` set according to ``placement`` (see :data:`PLACEMENTS`); a stage with
    ``replicas > 1`` cannot be embedded, and gets a worker process group of its own, ``p_<name>``."""
    import attrs

    return [
        attrs.evolve(
            stage,
            # A replicated stage runs in worker processes whatever the placement (its own group).
            process=f"p_{stage.name}" if stage.replicas > 1 else process_for(i, stage.name, placement),
        )
        for i, stage in enumerate(stages)
    ]


def placed(config: PipelineConfig | dict[str, Any], placement: str) -> PipelineConfig:
    """``config`` with every stage's ``process`` set by ``placement``.

    ``config`` is a :class:`~omni_trio.PipelineConfig` or the plain data of
    one (a dict, read with the same rules as :func:`omni_trio.load_config`).
    The ``process`` values already in ``config`` are replaced; the ``mixed``
    placement keeps the first stage of ``stages`` (in list order) in the caller.
    """
    import attrs

    from omni_trio.config.load import config_from_dict

    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    if isinstance(config, dict):
        config = config_from_dict(config)
    return attrs.evolve(config, stages=place_stages(config.stages, placement))


def busy_counters(stats: PipelineStats) -> list[str]:
    """The non-zero counters of ``stats`` as ``"name=value"`` (empty when ``stats.idle``)."""
    import attrs

    from omni_trio.stage.stats import CUMULATIVE

    busy = [f"live_requests={stats.live_requests}"] if stats.live_requests else []
    for stage_name, stage in sorted(stats.stages.items()):
        for field in attrs.fields(type(stage)):
            value = getattr(stage, field.name)
            # Running totals (compute time, bytes sent) are not state held for a request.
            if field.name != "healthy" and not field.metadata.get(CUMULATIVE) and value:
                busy.append(f"{stage_name}.{field.name}={value}")
    return busy


@asynccontextmanager
async def pipeline_for(
    config: PipelineConfig | dict[str, Any],
    placement: str = "embedded",
    *,
    trace: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> AsyncIterator[Pipeline]:
    """Open ``config`` placed by ``placement`` (see :func:`placed`) and yield the pipeline.

    Start-up must finish within ``timeout`` seconds (``trio.TooSlowError``
    otherwise); the block itself has no time limit. When the block exits
    normally, the pipeline must be idle: a request still live, or any stage
    counter not back to zero, raises ``AssertionError`` naming the counters.
    An exception from the block propagates unchanged, without the check.
    """
    import trio

    from omni_trio.runtime.pipeline import open_pipeline

    config = placed(config, placement)
    started = False
    with trio.CancelScope(deadline=trio.current_time() + timeout) as startup:
        async with open_pipeline(config, trace=trace, start_timeout=timeout) as pipeline:
            started = True
            startup.deadline = math.inf
            yield pipeline
            busy = busy_counters(await pipeline.stats())
            if busy:
                raise AssertionError(
                    f"the {placement} pipeline is not idle at the end of the block: {', '.join(busy)}"
                )
    if startup.cancelled_caught and not started:
        raise trio.TooSlowError(f"the {placement} pipeline did not start within {timeout} s")


#: What ``open_omni_pipeline`` returns: ``opener(config, *, trace=None, timeout=60)``.
PipelineOpener = Callable[..., AbstractAsyncContextManager["Pipeline"]]


# --------------------------------------------------------------------------- pytest plugin


def _selected(config: pytest.Config) -> list[str]:
    value = config.getoption("omni_placements", None)
    if not value:
        return list(PLACEMENTS)
    names = [name.strip() for name in str(value).split(",") if name.strip()]
    unknown = [name for name in names if name not in PLACEMENTS]
    if unknown or not names:
        raise pytest.UsageError(
            f"--omni-placements: unknown placement(s) {unknown}; use a comma-separated subset of {list(PLACEMENTS)}"
        )
    return list(dict.fromkeys(names))


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--omni-placements``."""
    group = parser.getgroup("omni-trio")
    group.addoption(
        "--omni-placements",
        dest="omni_placements",
        default=None,
        metavar="LIST",
        help="comma-separated placements the omni_placement fixture runs tests in "
        f"(default: all of {','.join(PLACEMENTS)})",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Check ``--omni-placements`` once, before collection."""
    _selected(config)


def _parametrized_by_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for marker in metafunc.definition.iter_markers("parametrize"):
        argnames = marker.args[0] if marker.args else marker.kwargs.get("argnames", "")
        if isinstance(argnames, str):
            argnames = [part.strip() for part in argnames.split(",")]
        if name in argnames:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that needs ``omni_placement`` once per selected placement."""
    if "omni_placement" in metafunc.fixturenames and not _parametrized_by_test(metafunc, "omni_placement"):
        placements = _selected(metafunc.config)
        metafunc.parametrize("omni_placement", placements, indirect=True, ids=placements)


@pytest.fixture
def omni_placement(request: pytest.FixtureRequest) -> str:
    """Where the stages of the test's pipeline run: ``embedded``, ``processes`` or ``mixed``."""
    placement = str(getattr(request, "param", _selected(request.config)[0]))
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    return placement


@pytest.fixture
def open_omni_pipeline(omni_placement: str) -> PipelineOpener:
    """``async with open_omni_pipeline(config) as pipeline:`` in the test's placement.

    Takes a PipelineConfig or a dict, and ``trace=`` and ``timeout=`` like
    :func:`pipeline_for`; the block must leave the pipeline idle.
    """
    return functools.partial(pipeline_for, placement=omni_placement)
