"""Stage factories of the failure tests (tests/reliability/test_failures_*.py), imported by dotted
path, also inside worker processes."""

from __future__ import annotations

import os
import time

from omni_trio import SimpleScheduler, StagePayload
from tests.stages import append_tag, blocking_until_aborted, create_slow_checksum

M = "tests.reliability.failure_stages"


def _write_pid(path: str) -> None:
    with open(f"{path}.tmp", "w", encoding="ascii") as handle:
        handle.write(str(os.getpid()))
    os.replace(f"{path}.tmp", path)  # the test never sees a half-written file


def create_holder():
    """Writes its process id to ``params["pid_file"]``, then holds the request until it is aborted
    (unless ``params["block"]`` is False); four requests at a time."""
    return blocking_until_aborted("blocked", lambda payload: _write_pid(payload.request.params["pid_file"]), 4)


def create_stuck():
    """Sleeps ``params["stuck_s"]`` seconds (default 0) and ignores aborts: user code that cannot be
    interrupted, such as a long C call; then appends ``"stuck"``. With ``params["started_file"]`` it
    first writes its process id there."""

    def fn(payload: StagePayload) -> StagePayload:
        params = payload.request.params
        if "started_file" in params:
            _write_pid(params["started_file"])
        time.sleep(float(params.get("stuck_s", 0)))
        return append_tag(payload, "stuck")

    return SimpleScheduler(fn)


def create_loop():
    """Counts the hops of a request that routes back to this stage forever (``next`` is the stage
    itself), on the event loop: its process's trio tasks are never all blocked while it runs."""

    def fn(payload: StagePayload) -> StagePayload:
        payload.data = {"hops": payload.data.get("hops", 0) + 1}
        return payload

    return SimpleScheduler(fn, inline=True)


def route_loop(request_id: str, output: StagePayload) -> str:
    """Back to the looping stage, forever (until the request is aborted)."""
    return "loop"


def create_warm_checksum(sleep_s: float = 0.0, first_sleep_s: float = 0.0):
    """``tests.stages.create_slow_checksum`` with torch imported at start-up, so that the first chunk
    of each consumer does not also wait for the import (seconds on a loaded machine)."""
    import torch  # noqa: F401 - the import is the point

    return create_slow_checksum(sleep_s, first_sleep_s)
