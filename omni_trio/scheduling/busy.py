"""BusyTime: how long a stage's compute ran, for ``stats()`` and ``/metrics``.

A scheduler wraps each call of user compute in :meth:`BusyTime.call`; the
stage reads :attr:`BusyTime.seconds` when asked for its counters. The total
is *compute-seconds*: calls that run at the same time on several threads
each add their own duration, so a stage with four busy workers gains four
seconds per second of wall time.

Cost: two ``perf_counter_ns`` reads per call, and no lock: each thread adds
to a cell of its own (a thread's first call registers it), and reading sums
the cells.
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
        self._lock = threading.Lock()  # guards the list of cells, not the cells
        self._cells: list[list[int]] = []
        self._local = threading.local()

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` and add its duration (also when it raises)."""
        start = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            self.add(time.perf_counter_ns() - start)

    def add(self, elapsed_ns: int) -> None:
        """Add ``elapsed_ns`` measured by the caller (an ``async`` compute on the stage's loop)."""
        cell = getattr(self._local, "cell", None)
        if cell is None:
            cell = self._new_cell()
        cell[0] += elapsed_ns  # only this thread writes its cell

    def _new_cell(self) -> list[int]:
        cell = [0]
        with self._lock:
            self._cells.append(cell)
        self._local.cell = cell
        return cell

    @property
    def seconds(self) -> float:
        """The total so far, in seconds."""
        with self._lock:
            return sum(cell[0] for cell in self._cells) / 1e9
