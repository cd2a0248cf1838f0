"""BusyTime: how long a stage's compute ran, for ``stats()`` and ``/metrics``.

A scheduler wraps each call of user compute in :meth:`BusyTime.call`; the
stage reads :attr:`BusyTime.seconds` when asked for its counters. The total
is *compute-seconds*: calls that run at the same time on several threads
each add their own duration, so a stage with four busy workers gains four
seconds per second of wall time.

Cost: two ``perf_counter_ns`` reads and one uncontended lock per call; the
lock is there because concurrent workers add to one total.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class BusyTime:
    """A thread-safe running total of compute time (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ns = 0

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` and add its duration (also when it raises)."""
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter_ns() - start
            with self._lock:
                self._ns += elapsed

    @property
    def seconds(self) -> float:
        """The total so far, in seconds."""
        return self._ns / 1e9
