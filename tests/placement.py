"""Build test pipelines in each placement from one stage list.

The placements and ``place`` come from the user-facing plugin,
:mod:`omni_trio.testing`, so our tests place stages the way users' tests do.
"""

from __future__ import annotations

from typing import Any

import omni_trio as ot
from omni_trio.testing import PLACEMENTS, process_for
from omni_trio.testing import place_stages as place

__all__ = ["PLACEMENTS", "build", "place", "process_for", "stage"]


def build(placement: str, *stages: ot.StageConfig, **kwargs: Any) -> ot.PipelineConfig:
    """A PipelineConfig of ``stages`` placed by ``placement``."""
    return ot.PipelineConfig(stages=place(list(stages), placement), **kwargs)


def stage(name: str, factory_name: str, **kwargs: Any) -> ot.StageConfig:
    """A StageConfig whose factory lives in tests.stages."""
    return ot.StageConfig(name=name, factory_path=f"tests.stages.{factory_name}", **kwargs)
