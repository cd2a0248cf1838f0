"""The wire's floor beside ours: 64 MB between two network namespaces, in one run, on one veth pair.

``python -m benchmarks.wire [--quick] [--mb 64] [--runs 5] [--json PATH]`` (root and ``ip netns``, as
:mod:`benchmarks.tcp`) makes two namespaces joined by a veth pair (:mod:`tests.netns`) and measures,
each as the median of ``--runs`` transfers of one buffer from the near namespace to the far one (the
sender's clock, from the first byte sent to the receiver's one-byte answer that it holds them all):

- ``plain``: one TCP connection, ``sendall`` of the buffer, ``recv_into`` a preallocated buffer: the
  wire's floor, with no authentication at all;
- ``aes-gcm``: the same with every 1 MiB sealed by AES-256-GCM (``cryptography``, AES-NI): encrypted
  into a reused buffer on the sender, received into a scratch buffer and decrypted into the
  destination (its tag checked) on the receiver: the floor of an authenticated, confidential path;
- ``W4-tcp``: ours, the main bench's row (:mod:`benchmarks.tcp`), its 4 MB and 64 MB transfers from
  a source stage's worker to a sink stage's ``manual`` worker in the far namespace.

``--quick`` (the tests' smoke run): 1 MiB, one transfer each, and W4-tcp's quick row (1 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import tcp as bench_tcp
from tests.netns import Namespaces, unavailable, veth_namespaces

__all__ = ["floors", "main", "measure", "run_row"]

MB = 1 << 20
#: What one AES-GCM record seals (the last one of a buffer may be shorter).
CHUNK = 1 << 20
TAG = 16
PORT = 47_100


def _nonce(counter: int) -> bytes:
    return counter.to_bytes(12, "big")


def _recv_exactly(conn: socket.socket, view: memoryview) -> None:
    while view:
        got = conn.recv_into(view)
        if not got:
            raise ConnectionError("the sender closed early")
        view = view[got:]


def _receive(mode: str, ip: str, size: int, runs: int) -> None:
    """The far side: accept one connection, take ``runs`` buffers, answer a byte after each."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = bytes(32)  # a benchmark's fixed key: what is measured is the cipher's work, not its secrecy
    target = memoryview(bytearray(size))
    scratch = memoryview(bytearray(CHUNK + TAG))
    with socket.create_server((ip, PORT)) as server:
        print("listening", flush=True)
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            counter = 0
            for _ in range(runs):
                if mode == "plain":
                    _recv_exactly(conn, target)
                else:
                    for start in range(0, size, CHUNK):
                        length = min(CHUNK, size - start)
                        _recv_exactly(conn, scratch[: length + TAG])
                        opener = Cipher(algorithms.AES(key), modes.GCM(_nonce(counter))).decryptor()
                        counter += 1
                        opener.update_into(scratch[:length], target[start : start + length])
                        opener.finalize_with_tag(bytes(scratch[length : length + TAG]))
                conn.sendall(b"k")


def _send(mode: str, ip: str, size: int, runs: int) -> None:
    """The near side: send ``runs`` buffers; print the seconds each took until its answer."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = bytes(32)
    source = memoryview(bytearray(os.urandom(size)))
    sealed = memoryview(bytearray(CHUNK + TAG))
    answer = bytearray(1)
    took = []
    with socket.create_connection((ip, PORT)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        counter = 0
        for _ in range(runs):
            start_s = time.perf_counter()
            if mode == "plain":
                conn.sendall(source)
            else:
                for start in range(0, size, CHUNK):
                    length = min(CHUNK, size - start)
                    sealer = Cipher(algorithms.AES(key), modes.GCM(_nonce(counter))).encryptor()
                    counter += 1
                    sealer.update_into(source[start : start + length], sealed)
                    sealer.finalize()
                    sealed[length : length + TAG] = sealer.tag
                    conn.sendall(sealed[: length + TAG])
            _recv_exactly(conn, memoryview(answer))
            took.append(time.perf_counter() - start_s)
    print("TOOK", json.dumps(took), flush=True)


def _pair(mode: str, hosts: Namespaces, size: int, runs: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    me = [sys.executable, "-m", "benchmarks.wire"]
    common = [mode, str(size), str(runs)]
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", hosts.far, *me, "--receive", hosts.far_ip, *common],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert receiver.stdout is not None
        if receiver.stdout.readline().strip() != "listening":
            raise RuntimeError(f"{mode}: the receiver did not start")
        sender = subprocess.run(
            ["ip", "netns", "exec", hosts.near, *me, "--send", hosts.far_ip, *common],
            capture_output=True, text=True, env=env, timeout=300, check=True,
        )
        line = next(x for x in sender.stdout.splitlines() if x.startswith("TOOK "))
        receiver.wait(timeout=30)
        return [float(x) for x in json.loads(line[len("TOOK "):])]
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def floors(hosts: Namespaces, mb: int, runs: int) -> dict[str, dict[str, float]]:
    """``plain`` and ``aes-gcm`` on the veth pair of ``hosts``: each one's median and spread (ms, MB/s)."""
    result: dict[str, dict[str, float]] = {}
    for mode in ("plain", "aes-gcm"):
        took = _pair(mode, hosts, mb * MB, runs)
        median = statistics.median(took)
        result[mode] = {
            "median_ms": median * 1000, "min_ms": min(took) * 1000, "max_ms": max(took) * 1000,
            "MB_per_s": mb / median,
        }
        print(mode, json.dumps(result[mode]), flush=True)
    return result


def run_row(quick: bool) -> dict[str, float]:
    """The main bench's ``wire-tcp`` row: the floors of 64 MB (``quick``: 1 MiB once) on a fresh veth pair,
    to read beside ``W4-tcp``'s 64 MB."""
    mb, runs = (1, 1) if quick else (64, 5)
    with veth_namespaces(f"w{os.getpid() % 10_000}") as hosts:
        found = floors(hosts, mb, runs)
    return {"size_MB": mb, "plain_ms": found["plain"]["median_ms"], "plain_MB_per_s": found["plain"]["MB_per_s"],
            "aes_gcm_ms": found["aes-gcm"]["median_ms"], "aes_gcm_MB_per_s": found["aes-gcm"]["MB_per_s"]}


def measure(mb: int, runs: int, quick: bool = False) -> dict[str, Any]:
    """One run of the three on one veth pair: each mode's median and spread (ms and MB/s); ``quick``:
    W4-tcp's quick row (1 MB) instead of its full one."""
    result: dict[str, Any] = {}
    with veth_namespaces(f"w{os.getpid() % 10_000}") as hosts:
        result.update(floors(hosts, mb, runs))
        ours = bench_tcp.run_on("W4", quick, hosts)
        big = "1MB" if quick else "64MB"
        result["W4-tcp"] = {"size_MB": 1 if quick else 64, "median_ms": ours[f"{big}_latency_ms"],
                            "MB_per_s": ours[f"{big}_MB_per_s"]}
        print("W4-tcp", json.dumps(result["W4-tcp"]), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    """Measure and print the three; write them to ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wire", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 MiB, one transfer each (a smoke run)")
    parser.add_argument("--mb", type=int, default=64, help="the buffer's size in MiB (the plain and AES-GCM rows)")
    parser.add_argument("--runs", type=int, default=5, help="transfers per mode")
    parser.add_argument("--json", default="out/bench-wire.json", metavar="PATH", help="where to write the results")
    parser.add_argument("--receive", nargs=4, metavar=("IP", "MODE", "SIZE", "RUNS"), help=argparse.SUPPRESS)
    parser.add_argument("--send", nargs=4, metavar=("IP", "MODE", "SIZE", "RUNS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for role, call in (("receive", _receive), ("send", _send)):
        if getattr(args, role):
            ip, mode, size, runs = getattr(args, role)
            call(mode, ip, int(size), int(runs))
            return 0
    reason = unavailable()
    if reason is not None:
        print(f"bench_wire: {reason}", file=sys.stderr)
        return 2
    result = measure(1, 1, quick=True) if args.quick else measure(args.mb, args.runs)
    bench_tcp.write_results(args.json, args.quick, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
