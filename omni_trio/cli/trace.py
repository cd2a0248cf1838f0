"""``omni-trio trace summary|export TRACE``: read a pipeline's trace (the views are :mod:`omni_trio.tracing.views`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from omni_trio.cli.common import EXIT_OK, UsageError
from omni_trio.tracing import views as traceview
from omni_trio.tracing.trace import read_trace, trace_files


def _read_trace_file(path: str) -> list[dict[str, Any]]:
    if not trace_files(Path(path)):
        raise UsageError(f"no trace file at {path}")
    try:
        return read_trace(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read trace {path}: {exc}") from None


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
    """Print a :class:`~omni_trio.tracing.views.TraceSummary` as the tables of ``trace summary``."""
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
        raise UsageError(f"cannot write {output}: {exc}") from None
    print(f"wrote {len(document['traceEvents'])} trace events ({len(events)} trace lines) to {output}; "
          "open it in https://ui.perfetto.dev or chrome://tracing")
    return EXIT_OK


def add_parser(commands: Any) -> None:
    """The ``trace`` command, its two subcommands and their arguments, in ``commands``."""
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
