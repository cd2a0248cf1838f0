"""Fixtures for the data-plane tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from omni_trio.comm.segments import SHM_DIR, remove_segments


def _leftovers(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))


@pytest.fixture
def shm_prefix() -> Iterator[str]:
    """A unique segment prefix; the test fails if it leaves a segment behind."""
    prefix = f"omnitrio-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield prefix
    leftovers = _leftovers(prefix)
    for name in leftovers:  # clean up even when asserting
        os.unlink(os.path.join(SHM_DIR, name))
    remove_segments(prefix)
    assert not leftovers, f"test left shared-memory segments behind: {leftovers}"
