"""A process's start-up heap, kept out of the garbage collector's full passes.

A worker imports torch and its stage modules (the template imports them once for all the workers it
forks) and builds its stages: some 200,000 objects that live as long as the process. CPython's full
(generation 2) collection walks every object it tracks; in a W5 worker that took 100-170 ms, about once
every hundred requests, while the worker's loop and its scheduler threads stood still
(``benchmarks/gc_pauses.py``, benchmarks/NOTES.md). ``gc.freeze()`` moves every object tracked so far
into the permanent generation, which collections skip; what the process makes later is collected as
before. In the template it has a second use: a collection in a forked worker would write into the
header of each inherited object it walks, copying the template's pages into the worker.

What is garbage at the moment of freezing (a cycle dropped during start-up) is never collected: a
one-time cost, bounded by what start-up made.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> None:
    """Move every object the collector tracks now to the permanent generation.

    Call it once start-up is over (imports done, stages built), never on a hot path: it is cheap
    (no object is walked) but everything frozen stays for the life of the process.
    """
    gc.freeze()
