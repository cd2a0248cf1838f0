"""The commands of ``omni-trio`` whose work is done elsewhere in the package: ``validate`` (the config),
``serve`` (:mod:`omni_trio.serve`), ``worker`` (:mod:`omni_trio.runtime.remote.worker_join`), ``reclaim``
(:mod:`omni_trio.comm.ownership`) and the deprecated ``bench`` (which starts ``python -m benchmarks``)."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import attrs

from omni_trio.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_app_dir,
    add_app_dir_option,
    load,
    prepare_trace,
    run_trio,
)


def cmd_validate(args: argparse.Namespace) -> int:
    """``omni-trio validate CONFIG``: check the config and that its hooks import."""
    add_app_dir(args.app_dir)
    config = load(args.config)  # its ConfigError: cli.parser.main prints every problem and exits 2
    terminals = ", ".join(config.terminal_stages)
    print(f"ok: {len(config.stages)} stages, entry {config.entry}, terminals [{terminals}]")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """``omni-trio serve CONFIG``: the pipeline behind an OpenAI-compatible HTTP server (docs/serving.md)."""
    from omni_trio.serve.command import serve_until_signalled

    add_app_dir(args.app_dir)
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.deadline is not None and args.deadline <= 0:
        raise UsageError("--deadline must be positive")
    config = load(args.config)
    if config.serve is None:
        raise UsageError(f"{args.config} has no [serve] table (model, adapter): see docs/serving.md")
    if args.deadline is not None:
        config = attrs.evolve(config, serve=attrs.evolve(config.serve, deadline_s=args.deadline))
    prepare_trace(args.trace)
    return run_trio(args.config, functools.partial(serve_until_signalled, config, host=args.host, port=args.port,
                                                   trace=args.trace, out=sys.stdout))


def cmd_reclaim(args: argparse.Namespace) -> int:
    """``omni-trio reclaim [--base DIR ...]``: remove what runs of provably dead processes left behind."""
    from omni_trio.comm.ownership import reclaim_dead_runs

    bases = [Path(base) for base in args.base or [tempfile.gettempdir()]]
    for base in bases:
        if not base.is_dir():
            raise UsageError(f"--base {base}: no such directory")
    reclaimed = reclaim_dead_runs(bases)
    for directory in reclaimed.directories:
        print(f"removed {directory}")
    print(f"removed {len(reclaimed.directories)} IPC director{'y' if len(reclaimed.directories) == 1 else 'ies'} "
          f"and {len(reclaimed.segments)} shared-memory segment(s) of dead runs")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    """``omni-trio bench ...`` (deprecated): runs ``python -m benchmarks ...`` in a checkout of the repository.

    The benchmarks are not part of the installed package; this command only starts them, so that scripts
    written for it keep working."""
    warnings.warn("'omni-trio bench' is deprecated: run 'python -m benchmarks' from a checkout of the repository",
                  DeprecationWarning, stacklevel=1)
    print("warning: 'omni-trio bench' is deprecated; run 'python -m benchmarks' from a checkout of the repository",
          file=sys.stderr)
    if importlib.util.find_spec("benchmarks.run") is None:
        print("error: the benchmarks live in a checkout of the omni-trio repository; run this from its root",
              file=sys.stderr)
        return EXIT_USAGE
    argv = ["--json", args.json]
    if args.quick:
        argv.append("--quick")
    if args.only:
        argv += ["--only", args.only]
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], check=False).returncode


def cmd_worker(args: argparse.Namespace) -> int:
    """``omni-trio worker --join tcp://HOST:PORT --key KEYFILE``: a ``manual`` process group's worker."""
    from omni_trio.runtime.remote.join import KeyFile
    from omni_trio.runtime.remote.worker_join import run_joined

    add_app_dir(args.app_dir)
    if not args.join.startswith("tcp://"):
        raise UsageError(f"--join takes the caller's tcp://HOST:PORT, got {args.join!r}")
    try:
        key = KeyFile.read(Path(args.key))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key.join != args.join:
        raise UsageError(f"--join {args.join} is not the address in the key file ({key.join})")
    run_joined(args.join, key)
    return EXIT_OK  # run_joined exits the process itself


def add_validate_parser(commands: Any) -> None:
    """The ``validate`` command and its arguments, in ``commands`` (the parser's subparsers)."""
    validate = commands.add_parser("validate", help="check a config file and that its hooks import",
                                   description="Load CONFIG (TOML, JSON or YAML), validate it and import every "
                                               "factory and hook. Lists every problem and exits 2 if any.")
    validate.add_argument("config", metavar="CONFIG", help="pipeline config file (.toml, .json, .yaml)")
    add_app_dir_option(validate)
    validate.set_defaults(handler=cmd_validate)


def add_parsers(commands: Any) -> None:
    """``serve``, ``worker``, ``bench`` and ``reclaim`` with their arguments, in ``commands``."""
    serve = commands.add_parser("serve", help="serve a pipeline over HTTP (OpenAI-compatible; docs/serving.md)",
                                description="Open the pipeline of CONFIG and serve it with the OpenAI speech and "
                                            "chat endpoints, /health and /metrics, until SIGINT or SIGTERM; then "
                                            "drain and close. Prints one line, 'listening on http://HOST:PORT'.")
    serve.add_argument("config", metavar="CONFIG", help="pipeline config file with a [serve] table")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)")
    serve.add_argument("--deadline", type=float, metavar="S", help="per-request deadline in seconds (504 after)")
    serve.add_argument("--trace", metavar="FILE", help="write a JSON-lines trace to FILE (workers write siblings)")
    add_app_dir_option(serve)
    serve.set_defaults(handler=cmd_serve)


    worker = commands.add_parser("worker", help="join a running pipeline as its 'manual' process group",
                                 description="Start the worker of a process group with launcher = \"manual\" "
                                             "(docs/distributed.md): join the caller at --join with the run's key "
                                             "file (written by the caller, mode 0600), serve until it ends.")
    worker.add_argument("--join", required=True, metavar="tcp://HOST:PORT", help="the caller's join address")
    worker.add_argument("--key", required=True, metavar="KEYFILE", help="the run's key file for this process")
    add_app_dir_option(worker)
    worker.set_defaults(handler=cmd_worker)


    bench = commands.add_parser("bench", help="deprecated: run python -m benchmarks from a checkout",
                                description="Run the benchmark suite: latency, throughput, tensor transfer, "
                                            "streaming, start-up and idle cost of worker-process pipelines.")
    bench.add_argument("--quick", action="store_true", help="small counts: the whole suite in well under a minute")
    bench.add_argument("--json", default="out/bench.json", metavar="PATH",
                       help="where to write the results (default: out/bench.json)")
    bench.add_argument("--only", metavar="LIST", help="comma-separated workloads: W1..W8, floor, idle")
    bench.set_defaults(handler=cmd_bench)


    reclaim = commands.add_parser("reclaim", help="remove what runs of dead processes left (temp dir, /dev/shm)",
                                  description="Remove the IPC directories and shared-memory segments of omni-trio "
                                              "runs whose owner process is provably gone (pid and start time), of "
                                              "this user only. open_pipeline does the same when it starts.")
    reclaim.add_argument("--base", action="append", metavar="DIR",
                         help="a directory that holds IPC directories (endpoints.base_path; default: the temp dir); "
                              "repeatable")
    reclaim.set_defaults(handler=cmd_reclaim)
