"""The ``omni-trio`` command line: validate and run pipeline configs, read traces.

Commands (see docs/cli.md)::

    omni-trio validate CONFIG
    omni-trio run CONFIG --input TEXT|@FILE [--stream] [--trace FILE] [--json] [--request-id ID] [--deadline S]
    omni-trio trace summary TRACE
    omni-trio trace export TRACE -o timeline.json
    omni-trio serve CONFIG [--host 127.0.0.1] [--port 8000] [--deadline S] [--trace FILE]
    omni-trio bench [--quick] [--json PATH] [--only W1,W4,...]
    omni-trio reclaim [--base DIR ...]

Exit codes: 0 ok, 1 the request failed (or the pipeline did), 2 a usage or
config error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM; the pipeline
was shut down as on Ctrl-C). Errors go to stderr.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio

from omni_trio import traceview
from omni_trio.config import PipelineConfig, check_imports
from omni_trio.configfile import load_config
from omni_trio.errors import ConfigError, OmniTrioError, Terminated
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.tracing import read_trace, trace_files

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

#: Tensors with at most this many elements are written out in full by ``--json``; larger ones as a summary.
JSON_TENSOR_LIMIT = 1024


APP_DIR_HELP = "directory added to sys.path for the config's dotted paths (default: the current directory)"


class _UsageError(Exception):
    """A problem with the command line or its files: exit 2 with the message."""


# --------------------------------------------------------------------------- helpers


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def _add_app_dir(app_dir: str) -> None:
    """Make the config's dotted paths importable from ``app_dir`` (default: the current directory)."""
    path = str(Path(app_dir).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)


def _load(path: str) -> PipelineConfig:
    """Read and import-check a config file; ConfigError for its problems, _UsageError if unreadable."""
    file = Path(path)
    if not file.is_file():
        raise _UsageError(f"no such config file: {path}")
    try:
        config = load_config(file)
    except OSError as exc:
        raise _UsageError(f"cannot read {path}: {exc}") from None
    check_imports(config)
    return config


def _print_config_error(path: str, error: ConfigError) -> None:
    count = len(error.problems)
    _err(f"error: invalid pipeline config {path} ({count} problem{'s' * (count != 1)}):")
    for problem in error.problems:
        _err(str(problem))


def _read_input(value: str) -> str:
    """``TEXT`` as is; ``@FILE`` the file's text (``@@...`` a literal leading ``@``)."""
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        file = Path(value[1:])
        try:
            return file.read_text(encoding="utf-8")
        except OSError as exc:
            raise _UsageError(f"cannot read input file {file}: {exc}") from None
    return value


def _json_object(text: str) -> dict[str, Any]:
    """argparse type of ``--params``: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def json_default(value: Any) -> Any:
    """``json.dumps`` default for results: tensors and arrays to lists (or a shape summary), attrs to dicts."""
    tolist = getattr(value, "tolist", None)
    shape = getattr(value, "shape", None)
    if callable(tolist) and shape is not None:
        numel = 1
        for size in shape:
            numel *= int(size)
        if numel <= JSON_TENSOR_LIMIT:
            if hasattr(value, "detach"):
                value = value.detach().cpu()
                tolist = value.tolist
            return tolist()
        return {"type": type(value).__name__, "shape": [int(size) for size in shape], "dtype": str(value.dtype)}
    if attrs.has(type(value)):
        return attrs.asdict(value, recurse=False)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (bytes, bytearray)):
        return {"type": "bytes", "length": len(value)}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=json_default, ensure_ascii=False)


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


# --------------------------------------------------------------------------- validate


def cmd_validate(args: argparse.Namespace) -> int:
    """``omni-trio validate CONFIG``: check the config and that its hooks import."""
    _add_app_dir(args.app_dir)
    try:
        config = _load(args.config)
    except ConfigError as exc:
        _print_config_error(args.config, exc)
        return EXIT_USAGE
    terminals = ", ".join(config.terminal_stages)
    print(f"ok: {len(config.stages)} stages, entry {config.entry}, terminals [{terminals}]")
    return EXIT_OK


# --------------------------------------------------------------------------- run


def _progress(message: str) -> None:
    """Progress of a long run, on stderr when it is a terminal (worker start-up can take
    seconds); pipes and files get the result alone."""
    if sys.stderr.isatty():
        print(message, file=sys.stderr, flush=True)


async def _run_request(config: PipelineConfig, args: argparse.Namespace, inputs: str, out: TextIO) -> int:
    from omni_trio.runtime.pipeline import open_pipeline

    status = EXIT_OK
    processes = sorted({stage.process for stage in config.stages if stage.process is not None})
    where = f" and {len(processes)} worker process(es)" if processes else ""
    _progress(f"starting {len(config.stages)} stage(s){where}...")
    started = time.monotonic()
    async with open_pipeline(config, trace=args.trace) as pipeline:
        _progress(f"ready in {time.monotonic() - started:.2f} s; running request {args.request_id!r}...")
        sent = time.monotonic()
        try:
            if args.stream:
                status = await _stream(pipeline, args, inputs, out)
            else:
                result = await pipeline.submit(args.request_id, inputs, params=args.params, deadline=args.deadline)
                print(_dumps(result) if args.json else repr(result), file=out, flush=True)
        except OmniTrioError as exc:
            # Caught inside the pipeline so that it closes normally around the failed request.
            _err(f"error: {exc}")
            status = EXIT_FAILED
        _progress(f"request finished in {(time.monotonic() - sent) * 1000:.1f} ms; shutting down...")
    return status


async def _stream(pipeline: Any, args: argparse.Namespace, inputs: str, out: TextIO) -> int:
    status = EXIT_OK
    async with pipeline.stream(args.request_id, inputs, params=args.params, deadline=args.deadline) as events:
        async for message in events:
            if isinstance(message, StreamMessage):
                if args.json:
                    line = _dumps({"type": "chunk", "request_id": message.request_id, "chunk_id": message.chunk_id,
                                   "from_stage": message.from_stage, "modality": message.modality,
                                   "chunk": message.chunk})
                else:
                    line = f"#{message.chunk_id} {message.from_stage}: {message.chunk!r}"
            elif isinstance(message, CompleteMessage):
                if not message.success:
                    status = EXIT_FAILED
                    _err(f"error: stage {message.from_stage!r} failed: {message.error}")
                if args.json:
                    line = _dumps({"type": "done", "request_id": message.request_id, "from_stage": message.from_stage,
                                   "success": message.success, "error": message.error, "result": message.result})
                else:
                    line = f"done {message.from_stage}: {message.result!r}"
            else:
                line = _dumps(message) if args.json else repr(message)
            print(line, file=out, flush=True)
    return status


def cmd_run(args: argparse.Namespace) -> int:
    """``omni-trio run CONFIG --input ...``: open the pipeline, run one request, print its result."""
    _add_app_dir(args.app_dir)
    if args.deadline is not None and args.deadline <= 0:
        raise _UsageError("--deadline must be positive")
    inputs = _read_input(args.input)
    if args.trace is not None:
        trace = Path(args.trace)
        if trace_files(trace):
            _err(f"warning: {trace} exists; this run's events are appended to it (use a fresh directory per run)")
        try:
            trace.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _UsageError(f"cannot create the trace directory {trace.parent}: {exc}") from None
    try:
        config = _load(args.config)
    except ConfigError as exc:
        _print_config_error(args.config, exc)
        return EXIT_USAGE
    try:
        return trio.run(_run_request, config, args, inputs, sys.stdout)
    except ConfigError as exc:
        _print_config_error(args.config, exc)
        return EXIT_USAGE
    except OmniTrioError as exc:
        _err(f"error: {exc}")
        return EXIT_FAILED
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            raise KeyboardInterrupt from None
        if any(isinstance(leaf, Terminated) for leaf in leaves):
            raise Terminated() from None
        if all(isinstance(leaf, OmniTrioError) for leaf in leaves):
            for leaf in leaves:
                _err(f"error: {leaf}")
            return EXIT_FAILED
        raise


# --------------------------------------------------------------------------- serve


def cmd_serve(args: argparse.Namespace) -> int:
    """``omni-trio serve CONFIG``: the pipeline behind an OpenAI-compatible HTTP server (docs/serving.md)."""
    from omni_trio.serve.command import serve_until_signalled

    _add_app_dir(args.app_dir)
    if not 0 <= args.port <= 65535:
        raise _UsageError(f"--port must be in 0..65535, got {args.port}")
    if args.deadline is not None and args.deadline <= 0:
        raise _UsageError("--deadline must be positive")
    config = _load(args.config)
    if config.serve is None:
        raise _UsageError(f"{args.config} has no [serve] table (model, adapter): see docs/serving.md")
    if args.deadline is not None:
        config = attrs.evolve(config, serve=attrs.evolve(config.serve, deadline_s=args.deadline))
    try:
        trio.run(functools.partial(serve_until_signalled, config, host=args.host, port=args.port,
                                   trace=args.trace, out=sys.stdout))
    except OmniTrioError as exc:
        _err(f"error: {exc}")
        return EXIT_FAILED
    except OSError as exc:  # the address is taken, or not ours to bind
        _err(f"error: cannot listen on {args.host}:{args.port}: {exc}")
        return EXIT_FAILED
    return EXIT_OK


def cmd_reclaim(args: argparse.Namespace) -> int:
    """``omni-trio reclaim [--base DIR ...]``: remove what runs of provably dead processes left behind."""
    from omni_trio.comm.ownership import reclaim_dead_runs

    reclaimed = reclaim_dead_runs([Path(base) for base in args.base or [tempfile.gettempdir()]])
    for directory in reclaimed.directories:
        print(f"removed {directory}")
    print(f"removed {len(reclaimed.directories)} IPC director{'y' if len(reclaimed.directories) == 1 else 'ies'} "
          f"and {len(reclaimed.segments)} shared-memory segment(s) of dead runs")
    return EXIT_OK


# --------------------------------------------------------------------------- trace


def _read_trace_file(path: str) -> list[dict[str, Any]]:
    if not trace_files(Path(path)):
        raise _UsageError(f"no trace file at {path}")
    try:
        return read_trace(path)
    except (OSError, ValueError) as exc:
        raise _UsageError(f"cannot read trace {path}: {exc}") from None


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO, right: Sequence[int] = ()) -> None:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            str(cell).rjust(width) if index in right else str(cell).ljust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=False))
        ]
        return "  ".join(parts).rstrip()

    print("  " + fmt(headers), file=out)
    for row in rows:
        print("  " + fmt(row), file=out)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(summary: traceview.TraceSummary, out: TextIO) -> None:
    """Print a :class:`~omni_trio.traceview.TraceSummary` as the tables of ``trace summary``."""
    print(f"{summary.events} events from {len(summary.processes)} process(es) "
          f"[{', '.join(summary.processes)}] over {summary.span_ms:.3f} ms", file=out)
    print("\ntransports (last choice per edge):", file=out)
    if summary.transports:
        rows = [
            [edge.stage, edge.direction, edge.peer, edge.transport, edge.process,
             " -> ".join(edge.history) if edge.changes else ""]
            for edge in summary.transports
        ]
        _table(["stage", "direction", "peer", "transport", "process", "changes"], rows, out)
    else:
        print("  (no comm_transport_selected events: every edge stayed in one process, or tracing missed them)",
              file=out)
    print("\nstage busy time (stage_dispatch -> stage_complete):", file=out)
    if summary.stages:
        rows = [[s.stage, str(s.count), f"{s.total_ms:.3f}", f"{s.mean_ms:.3f}"] for s in summary.stages]
        _table(["stage", "count", "total ms", "mean ms"], rows, out, right=(1, 2, 3))
    else:
        print("  (no stage events)", file=out)
    requests = summary.requests
    print("\nrequests:", file=out)
    print(f"  completed {requests.completed}, failed {requests.failed}, aborted {requests.aborted}"
          + (f", unfinished {requests.unfinished}" if requests.unfinished else ""), file=out)
    print(f"  latency ms: p50 {_ms(requests.percentile(50))}, p90 {_ms(requests.percentile(90))}, "
          f"p99 {_ms(requests.percentile(99))} (n={len(requests.latencies_ms)})", file=out)


def cmd_trace_summary(args: argparse.Namespace) -> int:
    """``omni-trio trace summary TRACE``: transports per edge, stage busy time, request latencies."""
    events = _read_trace_file(args.trace)
    print_summary(traceview.summarize(events), sys.stdout)
    return EXIT_OK


def cmd_trace_export(args: argparse.Namespace) -> int:
    """``omni-trio trace export TRACE -o FILE``: write a Chrome/Perfetto trace-event JSON timeline."""
    events = _read_trace_file(args.trace)
    document = traceview.chrome_trace(events)
    output = Path(args.output)
    try:
        output.write_text(json.dumps(document, default=str) + "\n", encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"cannot write {output}: {exc}") from None
    print(f"wrote {len(document['traceEvents'])} trace events ({len(events)} trace lines) to {output}; "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


# --------------------------------------------------------------------------- bench


def cmd_bench(args: argparse.Namespace) -> int:
    """``omni-trio bench [--quick] [--json PATH] [--only W1,...]``: run the benchmark suite (omni_trio.bench)."""
    from omni_trio import bench

    argv = ["--json", args.json]
    if args.quick:
        argv.append("--quick")
    if args.only:
        argv += ["--only", args.only]
    try:
        return bench.main(argv)
    except SystemExit as exc:  # a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# --------------------------------------------------------------------------- worker


def cmd_worker(args: argparse.Namespace) -> int:
    """``omni-trio worker --join tcp://HOST:PORT --key KEYFILE``: a ``manual`` process group's worker."""
    from pathlib import Path

    from omni_trio.runtime.join import KeyFile
    from omni_trio.runtime.worker_join import run_joined

    _add_app_dir(args.app_dir)
    if not args.join.startswith("tcp://"):
        raise _UsageError(f"--join takes the caller's tcp://HOST:PORT, got {args.join!r}")
    try:
        key = KeyFile.read(Path(args.key))
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    if key.join != args.join:
        raise _UsageError(f"--join {args.join} is not the address in the key file ({key.join})")
    run_joined(args.join, key)
    return EXIT_OK  # run_joined exits the process itself


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``omni-trio`` with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="omni-trio",
        description="Validate and run omni-trio pipeline configs, and read their traces.",
        epilog="exit codes: 0 ok, 1 request failed, 2 usage or config error, 130 interrupted, 143 terminated",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    validate = commands.add_parser("validate", help="check a config file and that its hooks import",
                                   description="Load CONFIG (TOML, JSON or YAML), validate it and import every "
                                               "factory and hook. Lists every problem and exits 2 if any.")
    validate.add_argument("config", metavar="CONFIG", help="pipeline config file (.toml, .json, .yaml)")
    validate.add_argument("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)
    validate.set_defaults(handler=cmd_validate)

    run = commands.add_parser("run", help="run one request through a pipeline",
                              description="Open the pipeline of CONFIG, run one request and print its result "
                                          "(or, with --stream, each stream event as it arrives).")
    run.add_argument("config", metavar="CONFIG", help="pipeline config file (.toml, .json, .yaml)")
    run.add_argument("--input", "-i", required=True, metavar="TEXT|@FILE",
                     help="the request's input text, or @FILE to read it from a file")
    run.add_argument("--stream", action="store_true", help="use pipeline.stream and print every event")
    run.add_argument("--trace", metavar="FILE", help="write a JSON-lines trace to FILE (workers write siblings)")
    run.add_argument("--json", action="store_true", help="print results as JSON (tensors as lists or shapes)")
    run.add_argument("--request-id", default="cli-0", metavar="ID", help="the request id (default: cli-0)")
    run.add_argument("--params", type=_json_object, metavar="JSON",
                     help='request params as a JSON object, e.g. \'{"seconds": 2}\' (the OmniRequest\'s params)')
    run.add_argument("--deadline", type=float, metavar="S", help="abort the request after S seconds")
    run.add_argument("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)
    run.set_defaults(handler=cmd_run)

    trace = commands.add_parser("trace", help="read a trace written with --trace / OMNI_TRIO_TRACE",
                                description="Read a pipeline trace (the main file; worker files next to it "
                                            "are merged).")
    trace_commands = trace.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    summary = trace_commands.add_parser("summary", help="transports, stage busy time, request latencies",
                                        description="Print the transport each edge chose, the time each stage "
                                                    "held requests, and request latency percentiles.")
    summary.add_argument("trace", metavar="TRACE", help="the pipeline's trace file (run.jsonl)")
    summary.set_defaults(handler=cmd_trace_summary)
    export = trace_commands.add_parser("export", help="write a Chrome/Perfetto timeline JSON",
                                       description="Write the trace as Chrome trace-event JSON: a track per "
                                                   "process and stage, a slice per request per stage, hand-off "
                                                   "arrows and stream chunks.")
    export.add_argument("trace", metavar="TRACE", help="the pipeline's trace file (run.jsonl)")
    export.add_argument("-o", "--output", required=True, metavar="FILE", help="the timeline file to write")
    export.set_defaults(handler=cmd_trace_export)

    serve = commands.add_parser("serve", help="serve a pipeline over HTTP (OpenAI-compatible; docs/serving.md)",
                                description="Open the pipeline of CONFIG and serve it with the OpenAI speech and "
                                            "chat endpoints, /health and /metrics, until SIGINT or SIGTERM; then "
                                            "drain and close. Prints one line, 'listening on http://HOST:PORT'.")
    serve.add_argument("config", metavar="CONFIG", help="pipeline config file with a [serve] table")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one (default: 8000)")
    serve.add_argument("--deadline", type=float, metavar="S", help="per-request deadline in seconds (504 after)")
    serve.add_argument("--trace", metavar="FILE", help="write a JSON-lines trace to FILE (workers write siblings)")
    serve.add_argument("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)
    serve.set_defaults(handler=cmd_serve)

    worker = commands.add_parser("worker", help="join a running pipeline as its 'manual' process group",
                                 description="Start the worker of a process group with launcher = \"manual\" "
                                             "(docs/distributed.md): join the caller at --join with the run's key "
                                             "file (written by the caller, mode 0600), serve until it ends.")
    worker.add_argument("--join", required=True, metavar="tcp://HOST:PORT", help="the caller's join address")
    worker.add_argument("--key", required=True, metavar="KEYFILE", help="the run's key file for this process")
    worker.add_argument("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)
    worker.set_defaults(handler=cmd_worker)

    bench = commands.add_parser("bench", help="run the benchmark suite (python -m omni_trio.bench)",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``omni-trio`` command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.handler(args))
    except _UsageError as exc:
        _err(f"error: {exc}")
        return EXIT_USAGE
    except ConfigError as exc:
        _print_config_error(getattr(args, "config", "config"), exc)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_INTERRUPTED
    except Terminated:
        _err("terminated (SIGTERM)")
        return EXIT_TERMINATED
