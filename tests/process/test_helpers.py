"""The leftover check every process test runs in (helpers.nothing_left_behind): a test that leaves
something fails, and only that test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from tests.process import helpers


async def test_an_unwaited_child_fails_the_test_that_left_it_and_is_reaped(tmp_path: Path) -> None:
    with trio.fail_after(10):
        pid = os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], os.environ)
        # Exited, and left unwaited (WNOWAIT): what a test that lost track of its child leaves.
        await trio.to_thread.run_sync(os.waitid, os.P_PID, pid, os.WEXITED | os.WNOWAIT, abandon_on_cancel=True)
    assert pid in helpers.zombie_children()
    left = pytest.raises(AssertionError, match=rf"child processes never waited for: \[{pid}\]")
    with left, helpers.nothing_left_behind(tmp_path):
        pass
    assert pid not in helpers.zombie_children()  # the next test starts clean
