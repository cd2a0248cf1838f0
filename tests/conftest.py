"""Shared fixtures: the placements every core test runs in.

``placement`` is the ``omni_placement`` fixture of our pytest plugin
(:mod:`omni_trio.testing`): every test that takes it runs in each placement,
and ``--omni-placements embedded`` restricts the run.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def placement(omni_placement: str) -> str:
    """Where the stages of a test pipeline run (see omni_trio.testing.PLACEMENTS)."""
    return omni_placement
