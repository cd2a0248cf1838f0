"""Request lifecycle events land in the trace file as JSON lines."""

from __future__ import annotations

import contextlib
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
