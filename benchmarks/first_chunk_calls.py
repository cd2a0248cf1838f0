"""W5's first chunk, counted: the Python function calls each process makes between ``stream()`` and the
caller's first chunk.

Run: ``python -m benchmarks.first_chunk_calls [--requests 20] [--chunks 1] [--top 12]`` (from the
repository root, in the test venv). Starts the bench's W5 pipeline (``bench_stages``: a talker streaming
small int64 chunks to a forwarding vocoder in another process, which forwards them to the caller),
streams 3 warm-up requests and then ``--requests`` more, and prints, for each process (``C``: the
caller, ``T``: the talker's process, ``V``: the vocoder's), the median number of Python calls and of
distinct functions in that window, then the modules those calls ran in, most calls first.

Why count: on this machine a cold step costs what it touches (benchmarks/NOTES.md, rounds eight to ten),
and timings swing 1.5x from one quarter of an hour to the next; a count does not. With ``--chunks 1``
every call in the window is on the first chunk's way (or the one-chunk stream's result right behind
it); with more chunks, the talker's thread makes the others meanwhile and they count too.

How: every process records each call (``sys.setprofile`` and ``threading.setprofile``, in all threads)
with its ``time.perf_counter_ns`` (one clock for all processes); the caller marks the window's ends.
This module is the workers' stage module (its factories build the bench's talker and vocoder), so the
recording starts in every process that builds a stage, when the variable below names a directory. The
profiler makes every call slow: the counts are the measurement here, never the time.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import statistics
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import trio

#: The directory the processes write their calls to; unset, importing this module records nothing.
CALLS_DIR = "OMNI_TRIO_CALLS_DIR"

#: (when, the function's file, its qualified name) of every Python call this process made since recording began.
_calls: list[tuple[int, str, str]] = []


def _record(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call":
        _calls.append((time.perf_counter_ns(), frame.f_code.co_filename, frame.f_code.co_qualname))


def _start_recording() -> None:
    threading.setprofile(_record)
    sys.setprofile(_record)


def _dump(directory: str, role: str) -> None:
    sys.setprofile(None)
    threading.setprofile(None)
    with open(os.path.join(directory, role), "w", encoding="utf-8") as out:
        out.writelines(f"{at}\t{filename}\t{name}\n" for at, filename, name in _calls)


from benchmarks import stages as bench_stages  # noqa: E402 - the stage code the factories below build


class CountedTalker(bench_stages.ChunkTalker):
    """The bench's talker; its process writes the calls it recorded when the stage stops."""

    def stop(self) -> None:
        """Write this process's calls, then stop as the bench's talker does."""
        _dump(os.environ[CALLS_DIR], "T")
        super().stop()


class CountedVocoder(bench_stages.ForwardingVocoder):
    """The bench's forwarding vocoder; its process writes the calls it recorded when the stage stops."""

    def stop(self) -> None:
        """Write this process's calls, then stop as the bench's vocoder does."""
        _dump(os.environ[CALLS_DIR], "V")
        super().stop()


def create_chunk_talker(chunks: int = 1000) -> CountedTalker:
    """A :class:`CountedTalker`; its process records calls from now on (it is built on the worker's loop)."""
    _start_recording()
    return CountedTalker(chunks)


def create_forwarding_vocoder() -> CountedVocoder:
    """A :class:`CountedVocoder`; its process records calls from now on."""
    _start_recording()
    return CountedVocoder()


async def _run(requests: int, chunks: int) -> list[tuple[int, int]]:
    import omni_trio as ot

    windows: list[tuple[int, int]] = []
    config = bench_stages.stream_config(chunks, "benchmarks.first_chunk_calls")
    with trio.fail_after(120 + requests * chunks / 100):
        async with ot.open_pipeline(config) as pipeline:
            _start_recording()
            for i in range(requests + 3):
                start, first = time.perf_counter_ns(), 0
                async with pipeline.stream(f"r{i}", "x", params={"chunks": chunks}) as events:
                    async for _ in events:
                        first = first or time.perf_counter_ns()
                if i >= 3:  # after the warm-up
                    windows.append((start, first))
    return windows


def main_process(requests: int, chunks: int, top: int, directory: Path) -> None:
    """In the caller: run the pipeline with every process recording, then print the counts."""
    windows = trio.run(_run, requests, chunks)
    _dump(str(directory), "C")
    repository = str(Path(__file__).resolve().parent.parent) + os.sep
    prefixes = {repository: "", sysconfig.get_paths()["stdlib"] + os.sep: "stdlib/"}
    for role in ("C", "T", "V"):
        rows = [line.split("\t") for line in (directory / role).read_text().splitlines()]
        calls = [(int(at), filename, name) for at, filename, name in rows]
        totals, functions, modules = [], [], collections.Counter[str]()
        for start, end in windows:
            inside = [(filename, name) for at, filename, name in calls if start <= at <= end]
            totals.append(len(inside))
            functions.append(len(set(inside)))
            modules.update(filename for filename, _ in inside)
        print(f"{role}: {statistics.median(totals):.0f} calls of {statistics.median(functions):.0f} functions "
              f"between stream() and the first chunk (median of {len(windows)} requests); by module:")
        for filename, count in modules.most_common(top):
            short = filename.split("site-packages" + os.sep)[-1]
            for prefix, shown in prefixes.items():
                if short.startswith(prefix):
                    short = shown + short.removeprefix(prefix)
            print(f"    {count / len(windows):6.1f}  {short}")


def main() -> None:
    """Parse the arguments, run the requests, print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--top", type=int, default=12, help="how many modules to list per process")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as directory:
        os.environ[CALLS_DIR] = directory
        # The workers import this module as benchmarks.first_chunk_calls (their stage module); this process
        # runs it as __main__ and records into that import's list too.
        counted = importlib.import_module("benchmarks.first_chunk_calls")
        run: Callable[[int, int, int, Path], None] = counted.main_process
        run(args.requests, args.chunks, args.top, Path(directory))


if __name__ == "__main__":
    main()
