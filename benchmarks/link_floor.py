"""The transport floor of a W1 request: three processes in a ring (main -> s0 -> s1 -> main), each a
trio loop that forwards a ~300-byte three-frame message, over pyzmq PUSH/PULL (ipc) or over trio-driven
Unix stream sockets with length-prefixed frames. Prints p50 per round trip and the CPU per request of
each process (all its threads, kernel included).

    python benchmarks/link_floor.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import trio
import zmq

from omni_trio.control.auth import FrameMac
from omni_trio.control.unix_link import UnixPull, UnixPush
from omni_trio.control.zmq_trio import SocketPolicy, TrioSocket

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


RING = ["main", "s0", "s1"]
LINKS = {"zmq": ZmqLink, "unix": UnixLink, "ours": OurLink}


async def role(kind: str, directory: str, me: str, requests: int) -> None:
    peer = RING[(RING.index(me) + 1) % 3]
    link = LINKS[kind](directory, me, peer)
    await link.start()
    if me != "main":
        cpu0 = 0.0
        for i in range(requests + 200):
            if i == 200:
                cpu0 = _cpu_us()
            await link.send(await link.recv())
        print(f"{me} cpu/request {(_cpu_us() - cpu0) / requests:.0f} us", flush=True)
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
    parser.add_argument("--role", nargs=3)
    args = parser.parse_args()
    if args.role:
        trio.run(role, *args.role, args.requests)
        return
    for kind in ["zmq", "unix", "ours"] * 2:
        with tempfile.TemporaryDirectory() as directory:
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--requests", str(args.requests), "--role", kind, directory, name]
                )
                for name in RING
            ]
            for proc in procs:
                proc.wait()
        print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
