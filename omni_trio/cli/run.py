"""``omni-trio run CONFIG --input ...``: open a pipeline, run one request, print its result or its stream."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import attrs

from omni_trio.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    add_app_dir,
    add_app_dir_option,
    err,
    load,
    prepare_trace,
    run_trio,
)
from omni_trio.config import PipelineConfig
from omni_trio.errors import OmniTrioError
from omni_trio.events import CompleteMessage, StreamMessage

#: Tensors with at most this many elements are written out in full by ``--json``; larger ones as a summary.
JSON_TENSOR_LIMIT = 1024


def _read_input(value: str) -> str:
    """``TEXT`` as is; ``@FILE`` the file's text (``@@...`` a literal leading ``@``)."""
    if value.startswith("@@"):
        return value[1:]
    if value.startswith("@"):
        file = Path(value[1:])
        try:
            return file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read input file {file}: {exc}") from None
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
            err(f"error: {exc}")
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
                    err(f"error: stage {message.from_stage!r} failed: {message.error}")
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
    add_app_dir(args.app_dir)
    if args.deadline is not None and args.deadline <= 0:
        raise UsageError("--deadline must be positive")
    inputs = _read_input(args.input)
    prepare_trace(args.trace)
    config = load(args.config)  # its ConfigError: cli.parser.main prints every problem and exits 2
    return run_trio(args.config, _run_request, config, args, inputs, sys.stdout)


def add_parser(commands: Any) -> None:
    """The ``run`` command and its arguments, in ``commands`` (the parser's subparsers)."""
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
    add_app_dir_option(run)
    run.set_defaults(handler=cmd_run)
