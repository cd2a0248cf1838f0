"""``omni-trio serve`` on SIGTERM exits once its requests in flight are answered, not at the grace period's end.

The clients keep their connections alive (one httpx pool): once each answer is
sent, its connection is idle, and the server must close it rather than wait
for the grace period. The stage ``held`` (embedded in the server's process)
reports each request it starts on one FIFO and waits for a byte on another,
so the test knows that every request is in the stage before the signal and
releases them after it, without sleeping.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler
from tests.serve.test_command import short_tmp  # noqa: F401 - the fixture
from tests.stages import append_tag

ROOT = Path(__file__).resolve().parents[2]
STREAMS = 32
GRACE_S = 30

CONFIG = f"""
entry_stage = "held"
[[stages]]
name = "held"
factory_path = "tests.serve.test_shutdown.create_held"
factory = {{started = "{{started}}", release = "{{release}}"}}
terminal = true
[serve]
model = "toy"
adapter = "tests.serve.adapters.TrailAdapter"
grace_period_s = {GRACE_S}
"""


def create_held(started: str, release: str) -> SimpleScheduler:
    """Writes a byte to the FIFO ``started`` per request, then waits for a byte on the FIFO ``release``."""
    # O_RDWR: neither open waits for the other end (Linux), and reads block until a byte comes.
    started_fd = os.open(started, os.O_RDWR)
    release_fd = os.open(release, os.O_RDWR)

    def fn(payload: StagePayload) -> StagePayload:
        os.write(started_fd, b"s")
        os.read(release_fd, 1)
        return append_tag(payload, "held")

    return SimpleScheduler(fn, max_concurrency=STREAMS)


@pytest.fixture
def fifos(short_tmp: Path) -> Iterator[tuple[Path, Path]]:  # noqa: F811 - the imported fixture
    """The ``started`` and ``release`` FIFOs of the ``held`` stage."""
    started, release = short_tmp / "started", short_tmp / "release"
    os.mkfifo(started)
    os.mkfifo(release)
    yield started, release


async def _line_starting(stream: trio.abc.ReceiveStream, prefix: str) -> str:
    buffer = b""
    while True:
        lines = buffer.split(b"\n")
        for line in lines[:-1]:
            if line.decode().startswith(prefix):
                return line.decode()
        buffer = lines[-1]
        data = await stream.receive_some()
        assert data, f"the server closed its output before a line starting with {prefix!r}"
        buffer += data


async def test_sigterm_exits_once_the_last_answer_is_sent_despite_idle_keep_alive_connections(
    short_tmp: Path, fifos: tuple[Path, Path]  # noqa: F811 - the imported fixture
) -> None:
    started, release = fifos
    config = short_tmp / "serve.toml"
    config.write_text(CONFIG.replace("{started}", str(started)).replace("{release}", str(release)))
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    server = await trio.lowlevel.open_process(
        [sys.executable, "-m", "omni_trio", "serve", str(config), "--port", "0", "--app-dir", str(ROOT)],
        cwd=short_tmp, env=env, stdout=-1, stderr=-1,
    )
    started_stream = trio.lowlevel.FdStream(os.open(started, os.O_RDWR | os.O_NONBLOCK))
    release_fd = os.open(release, os.O_RDWR)
    try:
        assert server.stdout is not None and server.stderr is not None
        with trio.fail_after(60):
            url = (await _line_starting(server.stdout, "listening on http://")).split()[-1]
        limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
        answers: list[int] = []
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=GRACE_S * 2) as client:

            async def ask(i: int) -> None:
                body = {"model": "toy", "messages": [{"role": "user", "content": f"hi {i}"}], "stream": True}
                response = await client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
                answers.append(response.status_code)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(STREAMS):
                        nursery.start_soon(ask, i)
                    reported = b""
                    while len(reported) < STREAMS:  # every request is in the stage
                        reported += await started_stream.receive_some(STREAMS - len(reported))
                    server.send_signal(signal.SIGTERM)
                    await _line_starting(server.stderr, "shutting down")
                    os.write(release_fd, b"r" * STREAMS)
                    released = time.monotonic()
            assert answers == [200] * STREAMS
            # The pool still holds its (now idle) connections while the server exits.
            with trio.fail_after(GRACE_S - 5):
                code = await server.wait()
            exited_after = time.monotonic() - released
        assert code == 0
        assert exited_after < 10, f"exited {exited_after:.1f} s after the last answer (grace period {GRACE_S} s)"
    finally:
        if server.returncode is None:
            server.kill()
            with trio.CancelScope(shield=True):
                await server.wait()
        await started_stream.aclose()
        os.close(release_fd)
