"""The omni-trio benchmark suite: latency, throughput, transfer and idle cost of real pipelines.

Run ``python -m benchmarks [--quick] [--json PATH] [--only W1,W4,...]`` (or ``omni-trio bench ...``);
``python -m benchmarks serving ...`` is the serving benchmark (:mod:`benchmarks.serving`).
Every stage runs in a worker process of its own unless a workload says otherwise. The workloads:

- ``W1``: a chain of 2 no-op stages, sequential requests after a warm-up: p50/p90/p99 latency (ms).
- ``W2``: the same with 4 stages.
- ``W3``: the 4-stage chain with 64 requests in flight: requests/s.
- ``W4``: a float32 tensor (4 MB and 64 MB) from a source stage to a sink stage in another process:
  MB/s and latency (median), next to the single-process cost of ``copy_`` into a preallocated
  buffer and of ``clone()``; the ``empty_`` metrics are the same with a source that builds its
  output with ``ot.empty`` (the opt-in zero-copy path, an extra column).
- ``W5``: a talker streams small int64 chunks to a streaming vocoder in another process that
  forwards each one to the caller: chunks/s and time to first chunk, medians of 20 requests of
  1000 chunks (``bench_measure.W5_REQUESTS``) after one of warm-up.
- ``W6``: split -> (upper, count) -> join, a process each: latency.
- ``W7``: the 4-stage chain with every stage in one worker process: latency.
- ``W8``: start-up and shutdown time of the 4-stage chain.
- ``W9``: a chain whose middle stage holds each request 20 ms outside the GIL, 16 in flight, with that
  stage's replicas at 1, 2 and 4: requests/s and speed-ups (:mod:`benchmarks.replicas`).
- ``floor``: raw round trips between two processes (no omni-trio): pyzmq PUSH/PULL over ipc, and a
  Unix stream socket (``unix_*``, the same-host link's transport).
- ``idle``: CPU used by a started, idle 4-stage pipeline (caller and workers), as % of one core.
- ``W1-tcp``, ``W4-tcp``, ``W5-tcp``: W1, W4 and W5 with a ``manual`` worker in a second network
  namespace, on a veth pair (:mod:`benchmarks.tcp`; root and ``ip netns`` needed, else skipped with
  the reason); ``wire-tcp``: the floor beside W4-tcp's 64 MB, the same bytes over one plain TCP
  connection and sealed with AES-GCM (:mod:`benchmarks.wire`); ``--only tcp`` runs the four.
- ``serve``: the omni_speech demo (one worker process per model, 24 tokens = 1.92 s of audio) behind
  ``ot.serve_http``: time to first audio and request latency (medians) over HTTP (httpx, streaming
  ``/v1/audio/speech``) and through ``pipeline.stream`` directly, with 1 and 8 concurrent clients.
  Needs the repository root on ``sys.path`` (the demo lives in ``examples/``) and httpx (a test extra).

``--quick`` shrinks every count so that the whole suite runs in well under a minute. The stages are
what a user writes: ``SimpleScheduler(fn)`` with its default arguments (``fn`` runs on the scheduler
thread), in a module that imports torch at the top. ``--inline`` runs the no-op and text stages'
compute on their stage's event loop instead (``SimpleScheduler(fn, inline=True)``: an extra column
of benchmarks/NOTES.md, not the headline). The results are printed as a table and written as JSON
(default ``out/bench.json``); ``--vs-sglang-omni`` adds SGLang-Omni's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from benchmarks import tcp as bench_tcp
from benchmarks import wire as bench_wire
from benchmarks.stages import STAGE_FACTORY
from benchmarks.workloads import floor_sync, idle, serve_bench, w1, w2, w3, w4, w5, w6, w7, w8, w9

WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "W8", "W9", "floor", "idle", "serve",
             "W1-tcp", "W4-tcp", "W5-tcp", "wire-tcp")
#: ``--only`` names that stand for several workloads.
GROUPS = {"tcp": ("W1-tcp", "W4-tcp", "W5-tcp", "wire-tcp")}


ASYNC_WORKLOADS: dict[str, Callable[[bool], Awaitable[dict[str, float]]]] = {
    "W1": w1, "W2": w2, "W3": w3, "W4": w4, "W5": w5, "W6": w6, "W7": w7, "W8": w8, "W9": w9, "idle": idle,
    "serve": serve_bench,
}


def run_workload(name: str, quick: bool) -> dict[str, float]:
    """Run one workload (a fresh ``trio.run`` each) and return its metrics."""
    if name == "floor":
        return floor_sync(quick)
    if name == "wire-tcp":
        return bench_wire.run_row(quick)
    if name.endswith("-tcp"):
        return bench_tcp.run_row(name, quick)
    return trio.run(ASYNC_WORKLOADS[name], quick)


def skip_reason(name: str) -> str | None:
    """Why workload ``name`` cannot run here (None: it can): the TCP rows need network namespaces."""
    if name.endswith("-tcp"):
        from tests.netns import unavailable

        reason = unavailable()
        return None if reason is None else f"the TCP rows run between network namespaces: {reason}"
    return None


# --------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments of ``python -m benchmarks``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Run the omni-trio benchmark suite.")
    parser.add_argument("--quick", action="store_true", help="small counts: the whole suite in well under a minute")
    parser.add_argument("--json", default="out/bench.json", metavar="PATH", help="where to write the results")
    groups = "; ".join(f"{group} = {'+'.join(names)}" for group, names in GROUPS.items())
    parser.add_argument("--only", metavar="LIST",
                        help=f"comma-separated workloads out of {','.join(WORKLOADS)} (or groups: {groups})")
    parser.add_argument("--inline", action="store_true",
                        help="run the no-op and text stages' compute on their event loops "
                             "(SimpleScheduler(inline=True)) instead of their scheduler threads")
    parser.add_argument("--vs-sglang-omni", action="store_true",
                        help="also run each workload on SGLang-Omni 0.1.9, right after ours, and print "
                             "ours/theirs ratios (install: docs/performance.md)")
    args = parser.parse_args(argv)
    if args.only:
        chosen = [w for name in args.only.split(",") if name.strip() for w in GROUPS.get(name.strip(), (name.strip(),))]
        unknown = [name for name in chosen if name not in WORKLOADS]
        if unknown:
            parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
        args.workloads = chosen
    else:
        args.workloads = list(WORKLOADS)
    return args


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Run the chosen workloads, print a table, write the JSON; 0 if every workload ran, 1 otherwise
    (2 when ``--vs-sglang-omni`` is asked for but SGLang-Omni is not importable). ``serving ...`` as the
    first argument runs the serving benchmark instead (:mod:`benchmarks.serving`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serving"]:
        from benchmarks import serving

        return serving.main(argv[1:])
    args = parse_args(argv)
    STAGE_FACTORY.clear()
    if args.inline:
        STAGE_FACTORY["inline"] = True
    comparison = None
    if args.vs_sglang_omni:
        from benchmarks import sglang as bench_sglang

        problem = bench_sglang.unavailable_message()
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
        comparison = bench_sglang.Comparison(args.quick)
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name in args.workloads:
        reason = skip_reason(name)
        if reason is not None:
            skipped[name] = reason
            print(f"skipping {name}: {reason}", file=sys.stderr, flush=True)
            continue
        print(f"running {name}...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            results[name] = run_workload(name, args.quick)
        except Exception as exc:  # noqa: BLE001 - one failed workload must not hide the others' numbers
            errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {name} failed: {errors[name]}", file=sys.stderr, flush=True)
        else:
            print(f"  {name} done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        if comparison is not None:
            comparison.run(name)
    rows = [(name, metric, _fmt(value)) for name, metrics in results.items() for metric, value in metrics.items()]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(("workload", "metric", "value"))]
    print(f"{'workload':<{widths[0]}}  {'metric':<{widths[1]}}  {'value':>{widths[2]}}")
    for workload, metric, value in rows:
        print(f"{workload:<{widths[0]}}  {metric:<{widths[1]}}  {value:>{widths[2]}}")
    document = {
        "quick": args.quick,
        "inline_stages": args.inline,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "workloads": results,
        "errors": errors,
        "skipped": skipped,
    }
    if comparison is not None:
        print(f"\nomni-trio vs SGLang-Omni (ours/theirs; the 'better' column says which way wins)\n"
              f"{comparison.table(results)}")
        document["sglang_omni"] = comparison.document(results)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 1 if errors or (comparison is not None and comparison.errors) else 0

