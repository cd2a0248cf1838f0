"""Scheduler options out of range are refused in the constructor, naming the option and the value."""

from __future__ import annotations

import math
from typing import Any

import pytest

from omni_trio.scheduling import (
    SessionScheduler,
    SimpleScheduler,
    StreamingSimpleScheduler,
    ThreadedSimpleScheduler,
)


def identity(payload: Any) -> Any:
    return payload


class NoHooks:
    def open(self, session_id: str, request: Any) -> None: ...
    def append(self, chunk: Any, payload: Any, context: Any) -> Any: ...
    def close(self, session_id: str) -> None: ...


BATCHING_BAD: list[tuple[str, Any]] = [
    ("max_batch_size", 0),
    ("max_batch_size", -3),
    ("max_batch_size", 2.5),
    ("max_batch_size", True),
    ("max_batch_wait_ms", -1),
    ("max_batch_wait_ms", math.inf),
    ("max_batch_wait_ms", math.nan),
    ("max_batch_wait_ms", "5"),
    ("max_batch_cost", -1),
    ("max_pending", 0),
    ("max_pending", -2),
]


@pytest.mark.parametrize(("option", "value"), BATCHING_BAD)
@pytest.mark.parametrize("make", [SimpleScheduler, StreamingSimpleScheduler])
def test_batching_options_out_of_range(make: Any, option: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{option} must be .*got {value!r}"):
        make(identity, **{option: value})


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_concurrency_below_one(value: Any) -> None:
    for make in (SimpleScheduler, ThreadedSimpleScheduler):
        with pytest.raises(ValueError, match=f"max_concurrency must be .*got {value!r}"):
            make(identity, max_concurrency=value)
    with pytest.raises(ValueError, match=f"max_concurrency must be .*got {value!r}"):
        SessionScheduler(NoHooks(), max_concurrency=value)


@pytest.mark.parametrize("option", ["max_open_sessions", "max_state_bytes_per_session"])
def test_session_limits_below_one(option: str) -> None:
    with pytest.raises(ValueError, match=f"{option} must be a whole number >= 1, got 0"):
        SessionScheduler(NoHooks(), **{option: 0})


def test_a_chunk_batch_cap_below_one() -> None:
    class Capped(StreamingSimpleScheduler):
        stream_chunk_batch_max = 0

    with pytest.raises(ValueError, match="stream_chunk_batch_max must be None or a whole number >= 1, got 0"):
        Capped(None)


def test_the_edges_of_the_ranges_are_accepted() -> None:
    SimpleScheduler(identity, max_batch_size=1, max_batch_wait_ms=0, max_batch_cost=0, max_pending=1)
    StreamingSimpleScheduler(identity, max_batch_size=1, max_batch_wait_ms=0.5, max_pending=None)
    ThreadedSimpleScheduler(identity, max_concurrency=1, max_pending=1)
    ThreadedSimpleScheduler(dispatch_fn=identity, max_concurrency=None)
    SessionScheduler(NoHooks(), max_open_sessions=1, max_concurrency=1, max_state_bytes_per_session=1)
