"""The floor of W5: a talker streams small chunks to a vocoder that forwards them, with no runtime code.

Three processes, as in W5 (``bench_stages.stream_config``): the caller sends a request to the talker;
the talker's loop hands it to a generating thread, which makes ``--chunks`` int64 tensors of 8
elements (``torch.arange``, as the bench's talker does) and hands each back to the loop; the loop sends
the first alone and then whatever accumulated, up to 64 chunks a message, their bytes packed with one
``torch.stack``. The vocoder's loop views each message's chunks as tensors (one ``torch.frombuffer``
and one ``unbind``) and hands each chunk to its scheduler thread and back, as a default streaming stage
must (a ``queue.SimpleQueue`` to the thread, ``run_sync_soon`` back), then forwards them to the caller
the same way. The caller views them and times the first chunk and the whole stream.

    python -m benchmarks.first_chunk_floor [--requests 60] [--chunks 1000] [--kinds ours,unix]

What is left out is everything the runtime adds: messages with their fields and checks, data
references, headers with metadata, the stage's bookkeeping. What stays is what default stage code on
this machine cannot avoid: the processes and their sockets (``ours``: our link, the run's proof on
every message; ``unix``: plain Unix stream sockets), the threads and their hand-offs, the tensors.
"""

from __future__ import annotations

import argparse
import collections
import os
import queue
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import torch
import trio
from link_floor import LINKS

MAX_CHUNKS = 64
_COUNT = struct.Struct("<I")
ELEMENTS = 8
STOP = b"stop"


class Link(Protocol):
    """One process's place in the ring (``link_floor.LINKS``): it receives from the one before it."""

    async def start(self) -> None: ...

    async def send(self, frames: list[bytes]) -> None: ...

    async def recv(self) -> list[bytes]: ...


def pack(chunks: list[torch.Tensor]) -> list[bytes]:
    """One message: the chunk count, then the chunks' bytes."""
    data = bytearray(len(chunks) * ELEMENTS * 8)
    torch.stack(chunks, out=torch.frombuffer(data, dtype=torch.int64).view(len(chunks), ELEMENTS))
    return [_COUNT.pack(len(chunks)), bytes(data)]


def unpack(frames: list[bytes]) -> tuple[torch.Tensor, ...]:
    """The chunks of a message, as tensors viewing its bytes."""
    (count,) = _COUNT.unpack(frames[0])
    return torch.frombuffer(bytearray(frames[1]), dtype=torch.int64).view(count, ELEMENTS).unbind(0)


class Outbox:
    """Chunks put by a thread, sent by the loop: the first after an idle spell alone, then in runs."""

    def __init__(self, send: Callable[[list[bytes]], Awaitable[None]]) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.send = send
        self.queued: collections.deque[torch.Tensor] = collections.deque()
        self.lock = threading.Lock()
        self.waiting = False
        self.wake = trio.Event()

    def put(self, chunk: torch.Tensor) -> None:
        """From a thread: queue ``chunk``, waking the loop if it sleeps."""
        with self.lock:
            self.queued.append(chunk)
            if self.waiting:
                self.waiting = False
                self.token.run_sync_soon(self.wake.set)

    async def drain(self) -> None:
        """Send what is queued, forever."""
        limit = MAX_CHUNKS
        while True:
            with self.lock:
                batch = [self.queued.popleft() for _ in range(min(limit, len(self.queued)))]
                if not batch:
                    self.waiting = True
                    self.wake = trio.Event()
            if not batch:
                await self.wake.wait()
                limit = 1
                continue
            limit = MAX_CHUNKS
            await self.send(pack(batch))


async def talker(link: Link, chunks: int) -> None:
    requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
    async with trio.open_nursery() as nursery:
        outbox = Outbox(link.send)

        def generate() -> None:
            while requests.get():
                for step in range(chunks):
                    outbox.put(torch.arange(step * ELEMENTS, step * ELEMENTS + ELEMENTS, dtype=torch.int64))

        generator = threading.Thread(target=generate, daemon=True)
        generator.start()
        nursery.start_soon(outbox.drain)
        while await link.recv() != [STOP]:
            requests.put(True)
        requests.put(False)
        # Joined: a process that exits while the thread is still in torch aborts in C++ ("terminate called").
        await trio.to_thread.run_sync(generator.join)
        await link.send([STOP])
        nursery.cancel_scope.cancel()


async def vocoder(link: Link) -> None:
    chunks: queue.SimpleQueue[torch.Tensor | None] = queue.SimpleQueue()
    async with trio.open_nursery() as nursery:
        outbox = Outbox(link.send)

        def forward() -> None:
            while (chunk := chunks.get()) is not None:
                outbox.put(chunk)

        forwarder = threading.Thread(target=forward, daemon=True)
        forwarder.start()
        nursery.start_soon(outbox.drain)
        while (frames := await link.recv()) != [STOP]:
            for chunk in unpack(frames):
                chunks.put(chunk)
        chunks.put(None)
        await trio.to_thread.run_sync(forwarder.join)
        nursery.cancel_scope.cancel()


async def caller(link: Link, requests: int, chunks: int, kind: str) -> None:
    firsts, walls = [], []
    for i in range(requests + 5):  # 5 warm-up requests
        start = time.perf_counter()
        await link.send([b"go" * 65])
        received, first = 0, 0.0
        while received < chunks:
            received += len(unpack(await link.recv()))
            if not first:
                first = time.perf_counter() - start
        if i >= 5:
            firsts.append(first * 1e3)
            walls.append((time.perf_counter() - start) * 1e3)
    await link.send([STOP])
    tenths = statistics.quantiles(firsts, n=10)
    print(
        f"{kind}: first chunk p10 {tenths[0]:.2f} / p50 {statistics.median(firsts):.2f} / p90 {tenths[-1]:.2f} ms; "
        f"stream p50 {statistics.median(walls):.1f} ms -> {chunks / statistics.median(walls) * 1e3:,.0f} chunks/s "
        f"(load {os.getloadavg()[0]:.1f})",
        flush=True,
    )


#: The processes in their ring: each sends to the next (the vocoder to the caller).
RING = ("main", "talker", "vocoder")


async def role(kind: str, directory: str, me: str, requests: int, chunks: int) -> None:
    link = LINKS[kind](directory, me, RING[(RING.index(me) + 1) % len(RING)])
    await link.start()
    if me == "talker":
        await talker(link, chunks)
    elif me == "vocoder":
        await vocoder(link)
    else:
        await caller(link, requests, chunks, kind)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--kinds", default="ours,unix")
    parser.add_argument("--role", nargs=3)
    args = parser.parse_args()
    if args.role:
        trio.run(role, *args.role, args.requests, args.chunks)
        return
    for kind in args.kinds.split(",") * 2:
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, __file__, "--requests", str(args.requests), "--chunks", str(args.chunks)]
            procs = [subprocess.Popen([*command, "--role", kind, directory, name]) for name in RING]
            for proc in procs:
                proc.wait()


if __name__ == "__main__":
    main()
