"""The demo (``python -m examples.omni_speech``) interrupted with Ctrl-C prints one line and exits 130, in
each placement; run to the end, it says its weights are random and leaves no temporary trace behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("placement", ["embedded", "processes"])
def test_ctrl_c_prints_one_line_and_exits_130(tmp_path: Path, placement: str) -> None:
    trace = tmp_path / "trace.jsonl"
    # 950 tokens in 4 requests: tens of seconds of work, interrupted once they were submitted.
    demo = subprocess.Popen(
        [sys.executable, "-m", "examples.omni_speech", "--tokens", "950", "--concurrency", "4", "--placement",
         placement, "--trace", str(trace)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # The demo says nothing until it is done: its trace shows the requests went in.
        while not (trace.exists() and "request_submitted" in trace.read_text()):
            assert demo.poll() is None and time.monotonic() < deadline, "the requests were never submitted"
            time.sleep(0.05)
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(30)
    assert (demo.returncode, out, err) == (130, "", "interrupted\n")


def test_a_run_says_the_weights_are_random_and_removes_its_temporary_trace(tmp_path: Path) -> None:
    demo = subprocess.run([sys.executable, "-m", "examples.omni_speech", "--tokens", "4"], cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert demo.returncode == 0, demo.stderr
    assert "weights are random" in demo.stdout
    assert list(tmp_path.iterdir()) == []
