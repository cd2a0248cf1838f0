"""The communication chapter's experiment: which transport did each edge pick?

``src`` produces a 4 MB "encoder output" and one or two stream chunks and
fans out to ``near`` (same process as ``src``) and ``far`` (a process of its
own); the stream goes to ``far`` only. Run::

    python -m examples.ch6_pipeline small|big [--trace PATH]

It prints ``RESULT <result>`` and, read back from the trace, the transport of
each edge and of each stream chunk (what the chapter's ``ch6_trace.py``
prints). In the reference the ``big`` run (a 64 KiB chunk, over the 16 KiB
inline limit) crashes the ``src`` process on a CPU-only machine; here that
chunk goes through shared memory.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot

M = "examples.ch6_stages"

#: The edges the chapter reports on: (direction, from stage, to stage).
EDGES = [("payload", "src", "near"), ("payload", "src", "far"), ("stream", "src", "far")]


def make_config(big_chunk: bool, base_path: str | None = None) -> ot.PipelineConfig:
    """src and near share process ``p_main``; far runs in ``p_far``."""
    return ot.PipelineConfig(
        model_path="toy",
        entry_stage="src",
        stages=[
            ot.StageConfig(name="src", process="p_main", factory_path=f"{M}.create_src",
                           next=["near", "far"], factory={"big_chunk": big_chunk}, stream_to=["far"],
                           project_payload={"near": f"{M}.project", "far": f"{M}.project"}),
            ot.StageConfig(name="near", process="p_main", factory_path=f"{M}.create_near", terminal=True),
            ot.StageConfig(name="far", process="p_far", factory_path=f"{M}.create_far", terminal=True,
                           can_accept_stream_before_payload=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base_path),
    )


def _remove_old_trace(trace_path: Path) -> None:
    # Trace files are appended to: start from empty ones (the file and its per-process siblings).
    suffix = trace_path.suffix or ".jsonl"
    for old in [trace_path, *trace_path.parent.glob(f"{trace_path.stem}.*{suffix}")]:
        old.unlink(missing_ok=True)


async def run(big_chunk: bool, trace_path: str | os.PathLike[str], base_path: str | None = None) -> dict[str, Any]:
    """Submit one request ("go") with tracing to ``trace_path``; return the merged result."""
    trace_path = Path(trace_path)
    _remove_old_trace(trace_path)
    async with ot.open_pipeline(make_config(big_chunk, base_path), trace=trace_path) as pipeline:
        result: dict[str, Any] = await pipeline.submit("r0", "go")
    return result


def summarize(trace_path: str | os.PathLike[str]) -> list[str]:
    """The chapter's per-edge summary, read from a trace."""
    chosen: dict[tuple[str, str, str], str] = {}
    sizes: list[tuple[int, str]] = []
    for event in ot.read_trace(trace_path):
        if event["event"] == "comm_transport_selected":
            chosen[(event["direction"], event["stage"], event["peer_stage"])] = event["transport"]
        elif event["event"] == "comm_stream_send" and (event["from_stage"], event["to_stage"]) == ("src", "far"):
            sizes.append((event["bytes"], event["transport"]))
    lines = [f"  {d:7s} {src} → {dst:5s} {chosen.get((d, src, dst), '（没经过通信层）')}" for d, src, dst in EDGES]
    lines += [f"  流式块 {nbytes} 字节 → {transport}" for nbytes, transport in sizes]
    return lines


def main() -> None:
    """Run the experiment and print the result and the trace summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["small", "big"])
    parser.add_argument("--trace", help="trace file (default: run.jsonl in a new temporary directory)")
    args = parser.parse_args()
    trace = Path(args.trace) if args.trace else Path(tempfile.mkdtemp(prefix="ch6-trace-")) / "run.jsonl"
    result = trio.run(run, args.mode == "big", trace)
    print("RESULT", result)
    print(f"== {args.mode} (trace: {trace})")
    for line in summarize(trace):
        print(line)


if __name__ == "__main__":
    main()
