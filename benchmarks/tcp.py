"""W1, W4 and W5 over TCP between two hosts: the main bench's ``W1-tcp``, ``W4-tcp`` and ``W5-tcp`` rows.

``python -m benchmarks --only tcp`` runs them with the other rows (:func:`run_row` each);
``python -m benchmarks.tcp [--quick] [--json PATH]`` runs only them.

Two network namespaces joined by a veth pair (:mod:`tests.netns`; root needed) stand for two
hosts: the caller runs in one (``ip netns exec``), a ``manual`` worker in the other, joined over CURVE.
The workloads are the bench's own (:mod:`benchmarks.workloads`), each stage in a worker process of its
own as there, with the last stage's worker on the other host: the worker -> worker edge crosses the
link, as does the result's way back to the caller.

- ``W1-tcp``: caller -> s0 (a local worker, ipc), s0 -> s1 (the remote worker, TCP), s1 -> caller
  (TCP): 3 socket hops, as in the local W1;
- ``W4-tcp``: the tensor source in a local worker, the sink in the remote one: the tensor crosses as
  zero-copy frames;
- ``W5-tcp``: the talker in a local worker streams to the remote vocoder, which forwards to the caller.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import attrs
import trio

from benchmarks import stages as bench_stages
from benchmarks import workloads as bench_workloads
from omni_trio.config import PipelineConfig
from omni_trio.config.processes import ProcessConfig
from tests.netns import Namespaces, unavailable, veth_namespaces

__all__ = ["WORKLOADS", "main", "run_on", "run_row", "tcp_placed", "write_results"]

#: workload -> the stages that go to the remote worker.
WORKLOADS = {"W1": {"s1"}, "W4": {"sink"}, "W5": {"vocoder"}}
_CONFIGS = {"W1": lambda q: bench_stages.chain_config(2), "W4": lambda q: bench_stages.tensor_config(),
            "W5": lambda q: bench_stages.stream_config(50 if q else 1000)}
_RUNS = {"W1": bench_workloads.w1, "W4": bench_workloads.w4, "W5": bench_workloads.w5}
#: How long one workload may take, start-up included.
TIMEOUT_S = 600


def tcp_placed(config: PipelineConfig, remote: set[str], main_host: str, far_host: str) -> PipelineConfig:
    """``config`` with the ``remote`` stages in one ``manual`` process on ``far_host``, the others where they were."""
    stages = [attrs.evolve(s, process="p_far") if s.name in remote else s for s in config.stages]
    processes = {"main": ProcessConfig(host=main_host), "p_far": ProcessConfig(launcher="manual", host=far_host)}
    return attrs.evolve(config, stages=stages, processes=processes)


def _inner(workload: str, quick: bool, main_host: str, far_host: str) -> None:
    config = tcp_placed(_CONFIGS[workload](quick), WORKLOADS[workload], main_host, far_host)
    result = trio.run(_RUNS[workload], quick, config)
    print("RESULT", json.dumps(result), flush=True)


def _forward_until(stream: IO[str], pattern: str, found: list[str], ready: threading.Event, seen: list[str]) -> None:
    for line in stream:
        seen.append(line)
        if not found and (match := re.search(pattern, line)):
            found.append(match.group(1))
            ready.set()
    ready.set()


def run_on(workload: str, quick: bool, hosts: Namespaces) -> dict[str, Any]:
    """Run ``workload`` (``W1``, ``W4``, ``W5``) with the caller in ``hosts.near`` and the remote stage's
    worker in ``hosts.far`` (namespaces that exist already); its metrics."""
    near, near_ip, far, far_ip = hosts.near, hosts.near_ip, hosts.far, hosts.far_ip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, "-m", "benchmarks.tcp", "--inner", workload, near_ip, far_ip]
    caller = subprocess.Popen(
        ["ip", "netns", "exec", near, *argv, *(["--quick"] if quick else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert caller.stderr is not None and caller.stdout is not None
    command: list[str] = []
    seen: list[str] = []
    ready = threading.Event()
    pattern = r"command='(omni-trio worker [^']*)'"
    reader = threading.Thread(target=_forward_until, args=(caller.stderr, pattern, command, ready, seen), daemon=True)
    reader.start()
    worker = None
    try:
        if not ready.wait(TIMEOUT_S) or not command:
            raise RuntimeError(f"{workload}: the caller did not wait for a worker")
        join, key = command[0].split()[3], command[0].split()[5]
        worker = subprocess.Popen(
            ["ip", "netns", "exec", far, sys.executable, "-m", "omni_trio", "worker", "--join", join, "--key", key],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        out, _ = caller.communicate(timeout=TIMEOUT_S)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        if caller.returncode != 0 or line is None:
            reader.join(5)
            tail = "".join(seen[-15:])
            raise RuntimeError(f"{workload}: the caller exited with {caller.returncode}:\n{tail}")
        result: dict[str, Any] = json.loads(line[len("RESULT "):])
        return result
    finally:
        for proc in (caller, worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def run_row(name: str, quick: bool) -> dict[str, Any]:
    """Run the row ``name`` (``W1-tcp``, ...) in two fresh network namespaces; its metrics."""
    workload = name.removesuffix("-tcp")
    if workload not in WORKLOADS or not name.endswith("-tcp"):
        raise ValueError(f"no TCP row {name!r}; choose from {[f'{w}-tcp' for w in WORKLOADS]}")
    with veth_namespaces(f"b{os.getpid() % 10_000}") as hosts:
        return run_on(workload, quick, hosts)


def main(argv: list[str] | None = None) -> int:
    """Run the TCP rows; print them and write them to ``--json``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tcp", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--json", default="out/bench-tcp.json", metavar="PATH", help="where to write the results")
    parser.add_argument("--inner", nargs=3, metavar=("WORKLOAD", "MAIN_HOST", "FAR_HOST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        _inner(args.inner[0], args.quick, args.inner[1], args.inner[2])
        return 0
    reason = unavailable()
    if reason is not None:
        print(f"bench_tcp: {reason}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    for workload in WORKLOADS:
        results[f"{workload}-tcp"] = run_row(f"{workload}-tcp", args.quick)
        print(f"{workload}-tcp", json.dumps(results[f"{workload}-tcp"]), flush=True)
    write_results(args.json, args.quick, results)
    return 0


def write_results(json_path: str, quick: bool, results: dict[str, Any]) -> None:
    """Write a run's ``results`` to ``json_path`` as JSON, with ``quick`` and the machine's load averages."""
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"quick": quick, "load": os.getloadavg(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
