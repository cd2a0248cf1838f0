"""The transport floor of a W1 request: three processes in a ring (main -> s0 -> s1 -> main), each a
trio loop that forwards a ~300-byte three-frame message, over pyzmq PUSH/PULL (ipc) or over trio-driven
Unix stream sockets with length-prefixed frames. Prints p50 per round trip and the CPU per request of
each process (all its threads, kernel included).

    python -m benchmarks.link_floor [--requests 3000] [--forwarders 2] [--handoffs 0] [--kinds zmq,unix,ours]

``--forwarders N`` puts N forwarding processes in the ring (W1: 2, W2: 4, W7: 1). ``--handoffs K``
makes each forwarder hand the message to a thread and back K times before sending it on, each time
to a thread of its own (a default stage's compute runs on its scheduler thread: W1 and W2 pay one per
forwarder, W7's one worker four), with the least a loop <-> thread round trip needs: a
``queue.SimpleQueue`` to the thread, ``run_sync_soon`` back to reschedule the waiting task. No runtime
code runs, so this is the floor of a workload with default stage semantics on this machine.
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import trio
import zmq

from omni_trio.control.sockets.unix_inbox import UnixPull
from omni_trio.control.sockets.unix_link import UnixPush
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire.auth import FrameMac

FRAMES = [b"x" * 40, b"y" * 200, b"z" * 60]
_HEAD = struct.Struct("<I")


def _cpu_us() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1e6


class ZmqLink:
    def __init__(self, directory: str, me: str, peer: str) -> None:
        self.ctx = zmq.Context()
        pull = self.ctx.socket(zmq.PULL)
        pull.bind(f"ipc://{directory}/{me}")
        push = self.ctx.socket(zmq.PUSH)
        push.connect(f"ipc://{directory}/{peer}")
        self.pull, self.push = TrioSocket(pull), TrioSocket(push)

    async def start(self) -> None:
        pass

    async def send(self, frames: list[bytes]) -> None:
        await self.push.send_multipart(frames)

    async def recv(self) -> list[bytes]:
        return await self.pull.recv_multipart()


class UnixLink:
    def __init__(self, directory: str, me: str, peer: str) -> None:
        self.path = f"{directory}/{me}"
        self.peer = f"{directory}/{peer}"
        self.buffer = bytearray()
        self.listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)

    async def start(self) -> None:
        await self.listener.bind(self.path)
        self.listener.listen()
        while True:
            try:
                self.out = await trio.open_unix_socket(self.peer)
                break
            except OSError:
                await trio.sleep(0.01)
        sock, _ = await self.listener.accept()
        self.inp = trio.SocketStream(sock)

    async def send(self, frames: list[bytes]) -> None:
        parts = [_HEAD.pack(len(frames))]
        for frame in frames:
            parts.append(_HEAD.pack(len(frame)))
            parts.append(frame)
        await self.out.send_all(b"".join(parts))

    async def recv(self) -> list[bytes]:
        while True:
            frames = self._parse()
            if frames is not None:
                return frames
            data = await self.inp.receive_some(65536)
            if not data:
                raise EOFError
            self.buffer += data

    def _parse(self) -> list[bytes] | None:
        buf = self.buffer
        if len(buf) < 4:
            return None
        (count,) = _HEAD.unpack_from(buf, 0)
        at = 4
        frames = []
        for _ in range(count):
            if len(buf) < at + 4:
                return None
            (size,) = _HEAD.unpack_from(buf, at)
            at += 4
            if len(buf) < at + size:
                return None
            frames.append(bytes(buf[at : at + size]))
            at += size
        del buf[:at]
        return frames


class OurLink:
    """omni_trio's own same-host link (UnixPull / UnixPush, the run's proof on every message)."""

    def __init__(self, directory: str, me: str, peer: str) -> None:
        policy = SocketPolicy(auth=FrameMac(b"k" * 32), max_message_bytes=1 << 20)
        self.pull = UnixPull(f"{directory}/{me}", policy)
        self.push = UnixPush(f"{directory}/{peer}", policy)

    async def start(self) -> None:
        while not os.path.exists(self.push.source):
            await trio.sleep(0.01)

    async def send(self, frames: list[bytes]) -> None:
        await self.push.send_multipart(frames)

    async def recv(self) -> list[bytes]:
        return await self.pull.recv_multipart()


LINKS = {"zmq": ZmqLink, "unix": UnixLink, "ours": OurLink}


class ThreadHandoff:
    """A thread that runs nothing: a task hands itself over and is rescheduled from the thread."""

    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.tasks: queue.SimpleQueue[trio.lowlevel.Task | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (task := self.tasks.get()) is not None:
            self.token.run_sync_soon(trio.lowlevel.reschedule, task)

    async def round_trip(self) -> None:
        """Wake the thread and wait until it wakes this task again."""
        self.tasks.put(trio.lowlevel.current_task())
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)


async def role(kind: str, directory: str, me: str, requests: int, ring: list[str], handoffs: int) -> None:
    peer = ring[(ring.index(me) + 1) % len(ring)]
    link = LINKS[kind](directory, me, peer)
    await link.start()
    if me != "main":
        threads = [ThreadHandoff() for _ in range(handoffs)]
        cpu0 = 0.0
        for i in range(requests + 200):
            if i == 200:
                cpu0 = _cpu_us()
            frames = await link.recv()
            for thread in threads:
                await thread.round_trip()
            await link.send(frames)
        print(f"{me} cpu/request {(_cpu_us() - cpu0) / requests:.0f} us", flush=True)
        for thread in threads:
            thread.tasks.put(None)
        return
    samples = []
    cpu0 = 0.0
    for i in range(requests + 200):
        if i == 200:
            cpu0 = _cpu_us()
        start = time.perf_counter()
        await link.send(FRAMES)
        await link.recv()
        samples.append(time.perf_counter() - start)
    cpu = (_cpu_us() - cpu0) / requests
    print(f"{kind}: p50 {statistics.median(samples[200:]) * 1e6:.0f} us, main cpu/request {cpu:.0f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--forwarders", type=int, default=2)
    parser.add_argument("--handoffs", type=int, default=0)
    parser.add_argument("--kinds", default="zmq,unix,ours")
    parser.add_argument("--role", nargs=3)
    args = parser.parse_args()
    ring = ["main", *(f"s{i}" for i in range(args.forwarders))]
    if args.role:
        trio.run(role, *args.role, args.requests, ring, args.handoffs)
        return
    print(f"ring of {len(ring)} processes, {args.handoffs} thread hand-off(s) per forwarder", flush=True)
    for kind in args.kinds.split(",") * 2:
        with tempfile.TemporaryDirectory() as directory:
            command = [sys.executable, __file__, "--requests", str(args.requests), "--forwarders", str(args.forwarders)]
            command += ["--handoffs", str(args.handoffs)]
            procs = [subprocess.Popen([*command, "--role", kind, directory, name]) for name in ring]
            for proc in procs:
                proc.wait()
        print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
