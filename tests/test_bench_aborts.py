"""The abort benchmark (``python -m benchmarks.aborts``) runs end to end at a small size and writes its JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_small_abort_storm_resolves_every_request_once_and_leaves_the_pipeline_idle(tmp_path: Path) -> None:
    out = tmp_path / "aborts.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.aborts", "--requests", "500", "--json", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["requests"] == 500 and figures["aborts_called"] == 450
    assert figures["resolved_once"] is True and figures["wrongly_resolved"] == {}
    assert figures["idle_after"] is True
    # abort() returns False only for a request that had finished; the rest were aborted.
    assert 0 < figures["aborts_accepted"] <= 450
    assert 0 <= figures["abort_p50_ms"] <= figures["abort_p90_ms"] <= figures["abort_p99_ms"] <= figures["abort_max_ms"]
    # The slow stage computed every request that was not aborted, and some of the aborted ones at most.
    computed = figures["computed_after_abort"] + figures["computed_before_abort"]
    finished = 500 - figures["aborts_accepted"]
    assert finished <= figures["slow_stage_computed"] == finished + computed
    # The caller's full collections, as counted by a gc callback: each a pause, some maybe among the aborts.
    assert all(pause >= 0 for pause in figures["caller_full_gc_ms"])
    assert 0 <= figures["full_gc_during_aborts"] <= len(figures["caller_full_gc_ms"])
