"""Build test pipelines in each placement from one stage list."""

from __future__ import annotations

from typing import Any

import attrs

import omni_trio as ot

#: embedded: every stage in the test's process; processes: one worker process per
#: stage; mixed: the first stage in the test's process, the others alternating
#: between two shared worker processes.
PLACEMENTS = ("embedded", "processes", "mixed")


def process_for(index: int, name: str, placement: str) -> str | None:
    """The process of the ``index``-th stage (called ``name``) in ``placement``."""
    if placement == "embedded":
        return None
    if placement == "processes":
        return f"p_{name}"
    if placement == "mixed":
        return None if index == 0 else ("group_a", "group_b")[index % 2]
    raise ValueError(f"unknown placement {placement!r}")


def place(stages: list[ot.StageConfig], placement: str) -> list[ot.StageConfig]:
    """Assign ``process`` to each stage according to ``placement``."""
    return [attrs.evolve(stage, process=process_for(i, stage.name, placement)) for i, stage in enumerate(stages)]


def build(placement: str, *stages: ot.StageConfig, **kwargs: Any) -> ot.PipelineConfig:
    """A PipelineConfig of ``stages`` placed by ``placement``."""
    return ot.PipelineConfig(stages=place(list(stages), placement), **kwargs)


def stage(name: str, factory_name: str, **kwargs: Any) -> ot.StageConfig:
    """A StageConfig whose factory lives in tests.stages."""
    return ot.StageConfig(name=name, factory_path=f"tests.stages.{factory_name}", **kwargs)
