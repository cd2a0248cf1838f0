"""W5's first chunk, step by step, across its three processes: the median time of each step after ``stream()``.

Run: ``python -m benchmarks.first_chunk_timeline [--requests 60] [--chunks 1000] [--pause-after-first MS]
[--max-queued-streams N]`` (from the repository root, in the test venv). Starts the bench's W5 pipeline
(``bench_stages``: a talker streaming small int64 chunks to a forwarding vocoder in another process,
which forwards them to the caller), streams 3 warm-up requests and then ``--requests`` more, one after
the other, and prints, for the steps each process took between ``stream()`` and the caller's first
chunk, the median µs at which it took each (``C``: the caller, ``T``: the talker's process, ``V``: the
vocoder's; ``#k``: the k-th time in that window). ``--pause-after-first MS`` makes the talker sleep that
long after it put its first chunk, so that the chunks behind it do not compete with it for the cores;
``--max-queued-streams N`` gives the talker a bounded outbox (``ot.Outbox(max_queued_streams=N)``),
whose ``put`` waits while N chunks are unsent.

How: every process records marks (``time.perf_counter_ns``, CLOCK_MONOTONIC, one clock for all
processes) at the steps below, by wrapping runtime functions in place: a diagnostic, not a way to build
anything. This module is the workers' stage module (its factories wrap the bench's talker and vocoder),
so the wrapping happens in every process that imports it, when the variable below names a directory;
each worker writes its marks there when its stage stops. Wrapping costs ~1 µs a mark: the timeline is a
little slower than the pipeline unmarked (``benchmarks/w5_cpu.py`` times that). A step whose function
was renamed or removed fails at once, naming it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import inspect
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

#: The directory the processes write their marks to; unset, importing this module wraps nothing.
MARKS_DIR = "OMNI_TRIO_TIMELINE_DIR"
PAUSE = "OMNI_TRIO_TIMELINE_PAUSE_MS"
BOUND = "OMNI_TRIO_TIMELINE_MAX_QUEUED_STREAMS"

#: (module, qualified name, label): the runtime steps marked on the way in (``>``) and out (``<``).
STEPS = [
    ("omni_trio.coordinator.coordinator", "Coordinator._admit", "admit"),
    ("omni_trio.runtime.worker_placement", "WorkerPlacement.submit", "submit"),
    ("omni_trio.control.sending", "encode_object", "encode object"),
    ("omni_trio.control.sending", "encode_inline", "encode inline"),
    ("omni_trio.control.peers", "encode", "encode message"),
    ("omni_trio.control.sockets.unix_link", "UnixPush.send_multipart", "seal + sendmsg"),
    ("omni_trio.control.dispatch", "decode", "decode message"),
    ("omni_trio.control.receiving", "decode_object", "decode object"),
    ("omni_trio.stage.stage", "Stage.execute", "to the scheduler"),
    ("omni_trio.scheduling.inbox", "Inbox.put_all", "chunks to the scheduler"),
    ("omni_trio.stage.outbound", "Outbound.handle_batch", "drain routes a batch"),
    ("omni_trio.coordinator.coordinator", "Coordinator.on_stream", "chunk to the reader"),
]

_marks: list[tuple[int, str]] = []


def mark(label: str) -> None:
    """Record ``label`` now."""
    _marks.append((time.perf_counter_ns(), label))


def _dump(directory: str) -> None:
    with open(os.path.join(directory, str(os.getpid())), "w", encoding="utf-8") as out:
        out.writelines(f"{at} {label}\n" for at, label in _marks)


def _wrap(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            mark(label + " >")
            result = await original(*args, **kwargs)
            mark(label + " <")
            return result

        setattr(owner, name, wrapped_async)
        return

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        mark(label + " >")
        result = original(*args, **kwargs)
        mark(label + " <")
        return result

    setattr(owner, name, wrapped)


def _wrap_step(module: str, qualname: str, label: str) -> None:
    owner: Any = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    if not hasattr(owner, name):
        raise SystemExit(f"first_chunk_timeline: {module}.{qualname} is gone; update STEPS")
    _wrap(owner, name, label)


def _wake_marks() -> None:
    """Mark a loop's wake-up (its wait for a readable socket returned) and each message read off a link."""
    from omni_trio.control.sockets import unix_inbox

    wait_readable = trio.lowlevel.wait_readable

    async def marked_wait_readable(fd: Any) -> None:
        await wait_readable(fd)
        mark("loop woken")

    trio.lowlevel.wait_readable = marked_wait_readable
    recv_nowait = unix_inbox.UnixPull.recv_nowait

    def marked_recv_nowait(self: unix_inbox.UnixPull) -> list[bytes] | None:
        message = recv_nowait(self)
        if message is not None:
            mark("message read")
        return message

    unix_inbox.UnixPull.recv_nowait = marked_recv_nowait  # type: ignore[method-assign]


def _install() -> None:
    if os.environ.get(MARKS_DIR) and not _marks:
        _wake_marks()
        for step in STEPS:
            _wrap_step(*step)
        mark("marks installed")


_install()

from benchmarks import stages as bench_stages  # noqa: E402 - after the wrapping, so that what it binds is wrapped too
from omni_trio.scheduling import IncomingMessage, Outbox, OutgoingMessage  # noqa: E402


class MarkedTalker(bench_stages.ChunkTalker):
    """The bench's talker, with marks where its thread takes a request and puts the request's first chunk
    (and, with ``--pause-after-first``, a pause after that put)."""

    def __init__(self, chunks: int) -> None:
        super().__init__(chunks)
        if os.environ.get(BOUND):
            self.outbox = Outbox(max_queued_streams=int(os.environ[BOUND]))

    def start(self) -> None:
        """Serve requests as the bench's talker does, through a marked inbox ``get`` and outbox ``put``."""
        pause = float(os.environ.get(PAUSE, "0")) / 1000
        get, put = self.inbox.get, self.outbox.put
        streaming: set[str] = set()

        def marked_get(*args: Any, **kwargs: Any) -> IncomingMessage:
            message = get(*args, **kwargs)
            if message.type == "new_request":
                mark("talker thread: has the request")
            return message

        def marked_put(item: OutgoingMessage, *args: Any, **kwargs: Any) -> None:
            first = item.type == "stream" and item.request_id not in streaming
            if first:
                streaming.add(item.request_id)
                mark("talker thread: first chunk made")
            elif item.type == "result":
                streaming.discard(item.request_id)
            put(item, *args, **kwargs)
            if first:
                mark("talker thread: first put returned")
                if pause:
                    time.sleep(pause)

        self.inbox.get = marked_get  # type: ignore[method-assign]
        self.outbox.put = marked_put  # type: ignore[method-assign]
        super().start()

    def stop(self) -> None:
        """Write this process's marks, then stop as the bench's talker does."""
        _dump(os.environ[MARKS_DIR])
        super().stop()


class MarkedVocoder(bench_stages.ForwardingVocoder):
    """The bench's forwarding vocoder, with a mark when its thread takes a request's first chunk."""

    def on_stream_chunk(self, request_id: str, item: Any) -> list[OutgoingMessage]:
        """Forward the chunk (marked when it is the request's first)."""
        if request_id not in self.counts:
            mark("vocoder thread: on_stream_chunk")
        return super().on_stream_chunk(request_id, item)

    def stop(self) -> None:
        """Write this process's marks, then stop as the bench's vocoder does."""
        _dump(os.environ[MARKS_DIR])
        super().stop()


def create_chunk_talker(chunks: int = 1000) -> MarkedTalker:
    """A :class:`MarkedTalker`."""
    return MarkedTalker(chunks)


def create_forwarding_vocoder() -> MarkedVocoder:
    """A :class:`MarkedVocoder`."""
    return MarkedVocoder()


async def _run(requests: int, chunks: int) -> None:
    import omni_trio as ot

    config = bench_stages.stream_config(chunks, "benchmarks.first_chunk_timeline")
    with trio.fail_after(120 + requests * chunks / 1000):
        async with ot.open_pipeline(config) as pipeline:
            for i in range(requests + 3):
                mark("caller: stream() called" if i >= 3 else "caller: warm-up")
                first = True
                async with pipeline.stream(f"r{i}", "x", params={"chunks": chunks}) as events:
                    async for _ in events:
                        if first:
                            mark("caller: first chunk")
                            first = False


def _timeline(directory: Path, caller: int) -> list[tuple[float, str, int]]:
    """Median µs after ``stream()`` of each (process, step, occurrence) seen in at least 60 % of requests."""
    marks: list[tuple[int, str, str]] = []
    roles = {"talker thread: has the request": "T", "vocoder thread: on_stream_chunk": "V"}
    for path in directory.iterdir():
        rows = [line.split(" ", 1) for line in path.read_text().splitlines()]
        labels = {label for _, label in rows}
        role = "C" if int(path.name) == caller else next((r for label, r in roles.items() if label in labels), "?")
        marks += [(int(at), role, label) for at, label in rows]
    marks.sort()
    starts = [i for i, (_, _, label) in enumerate(marks) if label == "caller: stream() called"]
    offsets: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    for start in starts:
        origin = marks[start][0]
        seen: collections.Counter[tuple[str, str]] = collections.Counter()
        for at, role, label in marks[start:]:
            offsets[(role, label, seen[(role, label)])].append((at - origin) / 1000)
            seen[(role, label)] += 1
            if label == "caller: first chunk":
                break
    return sorted(
        (statistics.median(values), f"{role} {label}" + (f" #{k}" if k else ""), len(values))
        for (role, label, k), values in offsets.items()
        if len(values) >= 0.6 * len(starts)
    )


def main() -> None:
    """Parse the arguments, run the requests, print the timeline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--pause-after-first", type=float, default=0.0, metavar="MS")
    parser.add_argument("--max-queued-streams", type=int, default=0, metavar="N",
                        help="give the talker an ot.Outbox(max_queued_streams=N) (default: the bench's, unbounded)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    with tempfile.TemporaryDirectory() as directory:
        os.environ[MARKS_DIR] = directory
        os.environ[PAUSE] = str(args.pause_after_first)
        os.environ[BOUND] = str(args.max_queued_streams or "")
        # The workers import this module as benchmarks.first_chunk_timeline (their stage module); this
        # process runs it as __main__ and wraps through that import too.
        marked = importlib.import_module("benchmarks.first_chunk_timeline")
        timeline: Callable[[int, int, Path], None] = marked.main_process
        timeline(args.requests, args.chunks, Path(directory))


def main_process(requests: int, chunks: int, directory: Path) -> None:
    """In the caller: run the pipeline with the marks on, then print the median timeline."""
    trio.run(_run, requests, chunks)
    _dump(str(directory))
    for median, step, count in _timeline(directory, os.getpid()):
        print(f"{median:8.0f} µs  {step}" + ("" if count >= 0.95 * requests else f"  (in {count} of {requests})"))


if __name__ == "__main__":
    main()
