"""Shared fixtures: the placements every core test runs in."""

from __future__ import annotations

import pytest

from tests.placement import PLACEMENTS


@pytest.fixture(params=PLACEMENTS)
def placement(request: pytest.FixtureRequest) -> str:
    """Where the stages of a test pipeline run (see tests/placement.py)."""
    return str(request.param)
