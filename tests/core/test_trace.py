"""Request lifecycle events land in the trace file as JSON lines."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import trio

import omni_trio as ot
from tests.placement import build, stage


async def test_lifecycle_events_are_traced(placement: str, tmp_path: Path) -> None:
    trace = tmp_path / "run.jsonl"
    config = build(
        placement,
        stage("a", "create_append", factory={"tag": "a"}, next="b"),
        stage("b", "create_fail_on", factory={"word": "poison", "tag": "b"}, terminal=True),
    )
    with trio.fail_after(30):
        async with ot.open_pipeline(config, trace=trace) as pipeline:
            await pipeline.submit("ok", "fine")
            with contextlib.suppress(ot.RequestFailed):
                await pipeline.submit("bad", "poison")
    events = ot.read_trace(trace)
    assert all({"event", "ts_ns", "process"} <= set(event) for event in events)

    def names(request_id: str) -> list[tuple[str, str]]:
        return [(e["event"], e.get("stage")) for e in events if e.get("request_id") == request_id
                and not e["event"].startswith("comm_")]

    assert names("ok") == [
        ("request_submitted", "a"),
        ("stage_dispatch", "a"),
        ("stage_complete", "a"),
        ("stage_dispatch", "b"),
        ("stage_complete", "b"),
        ("request_completed", "b"),
    ]
    bad = names("bad")
    assert ("stage_failed", "b") in bad and ("request_failed", "b") in bad
    edges = {(e["stage"], e["direction"], e["peer_stage"]): e["transport"]
             for e in events if e["event"] == "comm_transport_selected"}
    assert edges[("a", "payload", "b")] in {"local_object", "shm", "inline"}


_LOG_LINES = """
import sys
from omni_trio.tracing.trace import get_logger
log = get_logger("writer")
sys.stdin.read(1)  # both writers start writing together
for i in range(2000):
    log.warning("line", writer=sys.argv[1], i=i, padding="x" * 200)
"""


async def test_processes_sharing_stderr_write_whole_log_lines() -> None:
    # Workers inherit the caller's stderr: a line written as two writes (text, then newline) can have
    # another process's line land in between.
    read_end, write_end = os.pipe()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            writers = [
                await trio.lowlevel.open_process(
                    [sys.executable, "-c", _LOG_LINES, name], stdin=subprocess.PIPE, stderr=write_end
                )
                for name in ("a", "b")
            ]
            os.close(write_end)
            output = bytearray()
            nursery.start_soon(_read_all, read_end, output)
            for writer in writers:
                assert writer.stdin is not None
                await writer.stdin.send_all(b"go")
            for writer in writers:
                await writer.wait()
    lines = output.decode().splitlines()
    assert len(lines) == 4000
    whole = re.compile(r"\S+ \[warning +\] line +\[writer\] i=\d+ padding=x{200} writer=[ab]")
    assert all(whole.fullmatch(line) for line in lines)


async def _read_all(fd: int, into: bytearray) -> None:
    async with trio.lowlevel.FdStream(fd) as stream:
        async for chunk in stream:
            into += chunk
