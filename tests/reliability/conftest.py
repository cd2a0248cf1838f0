"""Every multi-process test must leave nothing behind (checked after each test)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.helpers import nothing_left_behind


@pytest.fixture(autouse=True)
def ipc_base() -> Iterator[Path]:
    """A short base directory for the tests' IPC directories (socket paths must stay under
    ~100 bytes, pytest's tmp_path may be too long); checks that the test left nothing behind."""
    base = Path(tempfile.mkdtemp(prefix="ot-proc-", dir="/tmp"))
    try:
        with nothing_left_behind(base):
            yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
