"""``omni-trio serve examples/omni_speech/serve.toml`` as a subprocess: one worker process per model.

It prints one line, serves the openai client, reports a killed worker on
/health (503 naming it) until its restart is ready, and on SIGTERM drains and
exits, leaving no process, socket or shared-memory segment behind. Once it listens it freezes its
start-up heap; the test of that runs the command in the test process itself, where the collector shows it.
"""

from __future__ import annotations

import functools
import gc
import io
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trio

import omni_trio as ot
from omni_trio.serve.command import serve_until_signalled
from tests.serve.command_process import cmdline, descendants, left_behind, serving

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "omni_speech" / "serve.toml"


def _health_until(url: str, status: int, seconds: float) -> httpx.Response:
    # The test waits on the server from outside; the server itself never polls.
    deadline = time.monotonic() + seconds
    while True:
        response = httpx.get(f"{url}/health", timeout=10)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (Unix socket paths are at most ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ots-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_serve_command_health_restart_and_clean_exit(short_tmp: Path) -> None:
    # The vocoder's restart waits 2 s: a window the 503 below is seen in on a loaded machine as on
    # an idle one (a worker forked from the template is ready a few ms after the backoff).
    config = short_tmp / "serve.toml"
    table = '[processes.p_vocoder]\nrestart = "on-failure"\n'
    config.write_text(CONFIG.read_text().replace(table, table + "restart_backoff_s = 2.0\n"))
    assert ot.load_config(config).process("p_vocoder").restart_backoff_s == 2.0
    with serving(config, short_tmp, "p_vocoder") as served:
        assert len(served.workers) == 5
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=60)
        with client.audio.speech.with_streaming_response.create(
            model="omni-speech-demo", input="hello", voice="alloy", response_format="pcm"
        ) as response:
            assert len(b"".join(response.iter_bytes())) == 24 * 4 * 320 * 2
        assert _health_until(served.url, 200, 0).json()["status"] == "ok"

        vocoder = next(pid for pid in served.workers if "p_vocoder.spec" in cmdline(pid))
        os.kill(vocoder, signal.SIGKILL)
        down = _health_until(served.url, 503, 30)
        assert down.status_code == 503, down.text
        assert down.json()["not_ready"] == {"p_vocoder": "restarting"}
        assert _health_until(served.url, 200, 120).status_code == 200  # the restarted worker is ready again

        served.workers |= descendants(served.process.pid)  # the restarted one and the template too
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(60) == 0
        assert served.process.stdout is not None and served.process.stdout.read() == ""  # exactly one line
    assert left_behind(served, short_tmp) == []


SMALL_CONFIG = """
entry_stage = "slow"
[[stages]]
name = "slow"
factory_path = "tests.stages.create_block_until_aborted"
process = "p_slow"
terminal = true
[serve]
model = "toy"
adapter = "tests.serve.adapters.TrailAdapter"
grace_period_s = 0.5
"""


def test_deadline_flag_then_sigint_drains_and_leaves_nothing(short_tmp: Path) -> None:
    config = short_tmp / "serve.toml"
    config.write_text(SMALL_CONFIG)
    with serving(config, short_tmp, "p_slow", "--deadline", "2", "--trace", str(short_tmp / "run.jsonl")) as served:
        url = served.url
        assert len(served.workers) == 1
        body = {"model": "toy", "messages": [{"role": "user", "content": "block"}], "stream": True}
        # --deadline is every request's default deadline: a request that cannot end gets a 504 after it.
        timed_out = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "deadline_exceeded"
        outcome: list[str] = []

        def held() -> None:
            try:  # its own deadline, past the grace period
                httpx.post(f"{url}/v1/chat/completions", json={**body, "deadline": 30}, timeout=60)
                outcome.append("answered")
            except httpx.HTTPError:
                outcome.append("cut off")

        client = threading.Thread(target=held)
        client.start()
        deadline = time.monotonic() + 30
        while "omni_trio_requests_in_flight 1.0" not in httpx.get(f"{url}/metrics").text:
            assert time.monotonic() < deadline, "the request never got in flight"
            time.sleep(0.05)
        # The request cannot end by itself: the grace period ends it, then the server exits.
        served.process.send_signal(signal.SIGINT)
        client.join(60)
        assert outcome == ["cut off"]
        assert served.process.wait(60) == 0
        assert served.process.stdout is not None and served.process.stdout.read() == ""
    assert left_behind(served, short_tmp) == []
    # --trace: the main process and the worker each wrote their events.
    events = ot.read_trace(short_tmp / "run.jsonl")
    assert {e["event"] for e in events} >= {"request_submitted", "request_aborted", "stage_dispatch"}
    assert {e["process"] for e in events} == {"main", "p_slow"}


class _Lines(io.StringIO):
    """What the command prints; ``printed`` is set at its first line."""

    def __init__(self) -> None:
        super().__init__()
        self.printed = trio.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if "\n" in self.getvalue():
            self.printed.set()
        return written


async def test_the_serve_command_freezes_its_start_up_heap_once_it_listens(short_tmp: Path) -> None:
    """The server's process is ours: its start-up heap (the app, the pipeline) leaves the full collections
    (docs/design.md); a subprocess keeps its collector to itself, so the command runs here."""
    config = ot.PipelineConfig(
        stages=[ot.StageConfig(name="a", factory_path="tests.stages.create_append", factory={"tag": "a"},
                               process="p_a", terminal=True)],
        endpoints=ot.EndpointsConfig(base_path=str(short_tmp)),
        serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.TrailAdapter"),
    )
    out = _Lines()
    gc.unfreeze()
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(serve_until_signalled, config, host="127.0.0.1", port=0,
                                                     trace=None, out=out))
                await out.printed.wait()
                frozen = gc.get_freeze_count()
                nursery.cancel_scope.cancel()
    finally:
        gc.unfreeze()
    assert out.getvalue().startswith("listening on http://127.0.0.1:")
    assert frozen > 0
    assert list(short_tmp.glob("omnitrio-*")) == []
