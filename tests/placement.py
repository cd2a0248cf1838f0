"""Build test pipelines in each placement from one stage list."""

from __future__ import annotations

from typing import Any

import attrs

import omni_trio as ot

#: embedded: every stage in the test's process.
PLACEMENTS = ("embedded",)


def place(stages: list[ot.StageConfig], placement: str) -> list[ot.StageConfig]:
    """Assign ``process`` to each stage according to ``placement``."""
    if placement == "embedded":
        return [attrs.evolve(stage, process=None) for stage in stages]
    raise ValueError(f"unknown placement {placement!r}")


def build(placement: str, *stages: ot.StageConfig, **kwargs: Any) -> ot.PipelineConfig:
    """A PipelineConfig of ``stages`` placed by ``placement``."""
    return ot.PipelineConfig(stages=place(list(stages), placement), **kwargs)


def stage(name: str, factory_name: str, **kwargs: Any) -> ot.StageConfig:
    """A StageConfig whose factory lives in tests.stages."""
    return ot.StageConfig(name=name, factory_path=f"tests.stages.{factory_name}", **kwargs)
