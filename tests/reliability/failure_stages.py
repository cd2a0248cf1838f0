"""Stage factories of the failure tests (tests/reliability/test_failures_*.py), imported by dotted
path, also inside worker processes."""

from __future__ import annotations

import time

from omni_trio import SimpleScheduler, StagePayload
from tests.stages import append_tag

M = "tests.reliability.failure_stages"


def create_stuck():
    """Sleeps ``params["stuck_s"]`` seconds (default 0) and ignores aborts: user code that cannot be
    interrupted, such as a long C call; then appends ``"stuck"``."""

    def fn(payload: StagePayload) -> StagePayload:
        time.sleep(float(payload.request.params.get("stuck_s", 0)))
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
