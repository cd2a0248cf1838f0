"""A request id used again after its request completed is served like a new one, by every scheduler;
an aborted id is not (the stage refuses it, and the scheduler skips what still comes for it)."""

from __future__ import annotations

from typing import Any

import pytest

from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler, ThreadedSimpleScheduler

from .helpers import assert_quiet, get, new_request, serving


def upper(payload: StagePayload) -> str:
    return str(payload.data).upper()


SCHEDULERS: dict[str, Any] = {
    "simple": lambda: SimpleScheduler(upper),
    "simple-concurrent": lambda: SimpleScheduler(upper, max_concurrency=2),
    "simple-batch": lambda: SimpleScheduler(
        upper, batch_compute_fn=lambda ps: [upper(p) for p in ps], max_batch_size=4
    ),
    "threaded": lambda: ThreadedSimpleScheduler(upper, max_concurrency=2),
}


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_a_completed_id_is_computed_again(kind: str) -> None:
    scheduler = SCHEDULERS[kind]()
    with serving(scheduler):
        for data in ("one", "two", "three"):
            scheduler.enqueue(new_request("r1", data))
            out = get(scheduler.outbox)
            assert (out.request_id, out.type, out.data) == ("r1", "result", data.upper())


@pytest.mark.parametrize("kind", sorted(SCHEDULERS))
def test_an_aborted_ids_late_request_is_skipped(kind: str) -> None:
    scheduler = SCHEDULERS[kind]()
    with serving(scheduler):
        scheduler.abort("r1")
        scheduler.enqueue(new_request("r1", "late"))
        scheduler.enqueue(new_request("r2", "next"))
        out = get(scheduler.outbox)
        assert (out.request_id, out.data) == ("r2", "NEXT")
        assert_quiet(scheduler.outbox, 0.1)
