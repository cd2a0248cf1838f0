"""The benchmark suite runs end to end (``--quick``, a subset of workloads) and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS --json OUT`` from the repository root (bounded by ``timeout``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


def test_quick_bench_subset_writes_positive_numbers(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = bench(out, "--quick", "--only", "W1,W5,W8,floor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["errors"] == {}
    workloads = document["workloads"]
    assert set(workloads) == {"W1", "W5", "W8", "floor"}
    for name, metrics in workloads.items():
        assert metrics, name
        for metric, value in metrics.items():
            assert isinstance(value, (int, float)) and value > 0, (name, metric, value)
    assert workloads["W1"]["p50_ms"] <= workloads["W1"]["p99_ms"]
    assert workloads["W5"]["chunks_per_request"] == 50
    assert document["inline_stages"] is False


def test_inline_runs_the_noop_compute_on_the_event_loops(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = bench(out, "--quick", "--inline", "--only", "W6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text(encoding="utf-8"))
    assert document["inline_stages"] is True and document["errors"] == {}
    assert document["workloads"]["W6"]["p50_ms"] > 0


def test_the_stage_factories_are_default_stage_code_unless_inline() -> None:
    from benchmarks import stages as suite

    assert not suite.create_noop().inline and suite.create_noop(inline=True).inline
    stages = suite.fanin_config().stages + suite.chain_config(2).stages
    assert all(stage.factory == {} for stage in stages)
    try:
        suite.STAGE_FACTORY["inline"] = True
        stages = suite.fanin_config().stages + suite.chain_config(2).stages
        assert all(stage.factory == {"inline": True} for stage in stages)
    finally:
        suite.STAGE_FACTORY.clear()


@pytest.mark.skipif(importlib.util.find_spec("sglang_omni") is not None, reason="SGLang-Omni is installed here")
def test_vs_sglang_omni_without_it_names_the_recipe_and_fails(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = bench(out, "--vs-sglang-omni", "--only", "W1", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SGLang-Omni 0.1.9" in proc.stderr and "docs/performance.md" in proc.stderr, proc.stderr
    assert "running W1" not in proc.stderr  # refused before any workload ran
    assert not out.exists()


def test_w4_ot_empty_column_is_compared_with_their_only_transfer() -> None:
    from benchmarks import sglang as bench_sglang

    ours = {"64MB_latency_ms": 8.0, "64MB_empty_latency_ms": 2.0, "64MB_empty_ratio_vs_copy": 0.5}
    theirs = {"64MB_latency_ms": 160.0}
    assert bench_sglang.compare(ours, theirs) == {"64MB_latency_ms": 0.05, "64MB_empty_latency_ms": 0.0125}
    rows = {line.split()[1]: line.split() for line in bench_sglang.table({"W4": ours}, {"W4": theirs}, {}).splitlines()}
    assert rows["64MB_empty_latency_ms"][2:5] == ["2", "160", "0.013"]


def test_w4_sources_are_default_code_and_ot_empty(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = bench(out, "--quick", "--only", "W4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads(out.read_text(encoding="utf-8"))["workloads"]["W4"]
    assert metrics["1MB_empty_latency_ms"] > 0 and metrics["1MB_empty_MB_per_s"] > 0
    assert metrics["1MB_latency_ms"] > 0


def test_serving_row_speaks_to_the_demo_over_http(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = bench(out, "--quick", "--only", "serve")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads(out.read_text(encoding="utf-8"))["workloads"]["serve"]
    assert metrics["http_c8_first_audio_ms"] > 0 and metrics["c1_latency_http_over_direct"] > 0


def test_quick_tcp_rows_run_in_the_main_bench_or_say_why_not(tmp_path: Path) -> None:
    from tests.netns import unavailable

    out = tmp_path / "bench.json"
    proc = bench(out, "--quick", "--only", "tcp", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text(encoding="utf-8"))
    rows = {"W1-tcp", "W4-tcp", "W5-tcp", "wire-tcp"}
    assert document["errors"] == {}
    reason = unavailable()
    if reason is not None:
        # Not root, or no ip netns: each row is skipped with the reason, printed and in the JSON.
        assert document["workloads"] == {} and set(document["skipped"]) == rows
        assert all(reason in why for why in document["skipped"].values())
        assert f"skipping W4-tcp: the TCP rows run between network namespaces: {reason}" in proc.stderr
        return
    assert document["skipped"] == {}
    results = document["workloads"]
    assert set(results) == rows
    for name, metrics in results.items():
        for metric, value in metrics.items():
            assert isinstance(value, (int, float)) and value > 0, (name, metric, value)
    assert results["W5-tcp"]["chunks_per_request"] == 50


def test_the_wire_floor_runs_beside_w4_tcp_or_says_why_not(tmp_path: Path) -> None:
    from tests.netns import unavailable

    out = tmp_path / "wire.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.wire", "--quick", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    reason = unavailable()
    if reason is not None:
        assert proc.returncode == 2 and reason in proc.stderr and not out.exists()
        return
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text(encoding="utf-8"))["results"]
    assert set(results) == {"plain", "aes-gcm", "W4-tcp"}
    for row in results.values():
        assert row["median_ms"] > 0 and row["MB_per_s"] > 0


async def test_w5_first_chunk_leaves_alone_at_the_talker_and_the_vocoder(tmp_path: Path) -> None:
    """The first chunk of a stream is sent by itself from both stages (the rest follows in runs),
    so it never waits for a run of chunks to fill; read from the trace of the real W5 pipeline."""
    import trio

    import omni_trio as ot
    from benchmarks.stages import stream_config

    trace = tmp_path / "w5.jsonl"
    with trio.fail_after(60):
        async with ot.open_pipeline(stream_config(40), trace=str(trace)) as pipeline:
            for i in range(3):
                async with pipeline.stream(f"r{i}", "x", params={"chunks": 40}) as events:
                    chunks = [event async for event in events if isinstance(event, ot.StreamMessage)]
                assert len(chunks) == 40
    sends = [e for e in ot.read_trace(str(trace)) if e["event"] == "comm_stream_send"]
    for i in range(3):
        for stage in ("talker", "vocoder"):
            mine = sorted((e["chunk_id"], e["chunk_count"]) for e in sends
                          if e["request_id"] == f"r{i}" and e["from_stage"] == stage)
            assert mine[0] == (0, 1), (stage, mine)
            assert sum(count for _, count in mine) == 40


def test_without_root_the_tcp_rows_say_why_they_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import run as suite

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert suite.skip_reason("W1-tcp") == (
        "the TCP rows run between network namespaces: needs root to create network namespaces (ip netns)"
    )
    assert suite.skip_reason("W1") is None
    assert suite.parse_args(["--only", "W1,tcp"]).workloads == ["W1", "W1-tcp", "W4-tcp", "W5-tcp", "wire-tcp"]


def _script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.NAME ARGS`` from the repository root (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name.removesuffix('.py')}", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )


def test_first_chunk_timeline_marks_the_steps_of_all_three_processes() -> None:
    """The script wraps runtime functions by name: a rename must fail here, not in a later session."""
    proc = _script("first_chunk_timeline.py", "--requests", "5", "--chunks", "20", "--pause-after-first", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("µs", 1)[1].strip() for line in proc.stdout.splitlines() if "µs" in line]
    # Each request's marks end at its first chunk; a step seen in only some requests ("(in 3 of 5)")
    # has its median over those, which can fall after the first chunk's median over all of them.
    in_every_request = [row for row in rows if "(in " not in row]
    assert in_every_request[0] == "C caller: stream() called", rows
    assert in_every_request[-1] == "C caller: first chunk", rows
    for step in ("C seal + sendmsg >", "T loop woken", "T talker thread: has the request", "T encode object >",
                 "V decode object >", "V vocoder thread: on_stream_chunk", "C chunk to the reader >"):
        assert step in rows, (step, rows)


def test_first_chunk_calls_counts_the_calls_of_all_three_processes() -> None:
    proc = _script("first_chunk_calls.py", "--requests", "3", "--top", "100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = {line[0]: int(line.split()[1]) for line in proc.stdout.splitlines() if line[:2] in ("C:", "T:", "V:")}
    assert set(counts) == {"C", "T", "V"} and all(count > 50 for count in counts.values()), proc.stdout
    assert "omni_trio/control/wire/codec.py" in proc.stdout, proc.stdout


def test_gc_pauses_runs_the_stream_and_reports_its_requests() -> None:
    proc = _script("gc_pauses.py", "--requests", "5", "--chunks", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 requests of 20 chunks: wall p50" in proc.stdout, proc.stdout
