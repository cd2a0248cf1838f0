"""The serving benchmark's clients on omni-trio: in process (``pipeline.stream``) and over HTTP (the
pipeline behind ``omni-trio serve`` in a process of its own, streamed with httpx), the loads that drive
them, and the CPU the processes spent.

A driver is an async context manager whose ``one(request_id)`` streams one utterance and returns its
:class:`~benchmarks.serving_metrics.StreamRecord`; ``pids()`` are the processes whose CPU is counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from benchmarks.measure import descendant_pids, proc_cpu_ticks
from benchmarks.serving_metrics import StreamRecord, load_offsets
from benchmarks.serving_model import SAMPLE_RATE
from benchmarks.serving_stages import MODEL, PipelineShape, make_config

ROOT = Path(__file__).resolve().parent.parent
OneStream = Callable[[str], Awaitable[StreamRecord]]


class InProcessDriver:
    """``pipeline.stream`` in this process; its workers are this process's descendants."""

    name = "inproc"

    def __init__(self, shape: PipelineShape) -> None:
        self.shape = shape
        self._stack = AsyncExitStack()
        self._pipeline: ot.Pipeline | None = None

    async def __aenter__(self) -> InProcessDriver:
        self._pipeline = await self._stack.enter_async_context(ot.open_pipeline(make_config(self.shape)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def pids(self) -> dict[int, str]:
        """This process (the caller) and its workers."""
        return {os.getpid(): "caller", **{pid: _label(pid) for pid in descendant_pids(os.getpid())}}

    async def one(self, request_id: str) -> StreamRecord:
        """Stream one utterance; a ``QueueFullError`` is a refusal."""
        assert self._pipeline is not None
        record = StreamRecord(time.perf_counter())
        try:
            async with self._pipeline.stream(request_id, "speak", params={"frames": self.shape.frames}) as events:
                async for event in events:
                    if isinstance(event, ot.StreamMessage) and event.modality == "audio":
                        samples = len(event.chunk) // 2
                        record.arrivals.append((time.perf_counter(), samples))
                        # As a player passing the audio on (the HTTP server does the same): stream
                        # admission then times the stream by its playback deadline.
                        events.declare_playback(samples / SAMPLE_RATE)
        except ot.QueueFullError:
            record.outcome = "refused"
        except Exception as exc:  # noqa: BLE001 - a failed stream is a result, counted as such
            record.outcome, record.error = "failed", f"{type(exc).__name__}: {exc}"
        record.finished = time.perf_counter()
        return record


class HttpDriver:
    """The pipeline behind ``python -m omni_trio serve CONFIG --port 0`` (a process of its own, its workers
    its children), streamed with httpx: ``POST /v1/audio/speech`` with ``stream_format="audio"`` (raw
    PCM16 as it is made). Every HTTP read is an arrival of ``bytes // 2`` samples (an odd byte waits for
    the next read); a 429 is a refusal."""

    name = "http"

    def __init__(self, shape: PipelineShape, max_connections: int = 512) -> None:
        self.shape = shape
        self.max_connections = max_connections
        self._stack = AsyncExitStack()
        self._server: trio.Process | None = None
        self._client: Any = None

    async def __aenter__(self) -> HttpDriver:
        import httpx

        from omni_trio.config.save import save_config  # not public yet: see SERVING_NOTES.md

        folder = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="omnitrio-serving-"))
        config_path = Path(folder) / "serving.toml"
        save_config(make_config(self.shape, serve=True), config_path)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self._server = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omni_trio", "serve", str(config_path), "--port", "0"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self._stack.push_async_callback(self._stop_server)
        url = await self._listening_url()
        self._client = await self._stack.enter_async_context(httpx.AsyncClient(
            base_url=url, timeout=httpx.Timeout(300),
            limits=httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _listening_url(self) -> str:
        """Read the server's stdout until it prints ``listening on URL``."""
        assert self._server is not None and self._server.stdout is not None
        text = b""
        with trio.fail_after(120):
            while b"listening on " not in text or not text.split(b"listening on ", 1)[1].count(b"\n"):
                data = await self._server.stdout.receive_some()
                if not data:
                    raise RuntimeError(f"omni-trio serve exited before listening: {text.decode(errors='replace')}")
                text += data
        return text.split(b"listening on ", 1)[1].split(b"\n", 1)[0].decode().strip()

    async def _stop_server(self) -> None:
        """SIGTERM: the server lets streams finish, closes its pipeline and exits."""
        assert self._server is not None
        self._server.terminate()
        with trio.move_on_after(60) as waited:
            await self._server.wait()
        if waited.cancelled_caught:
            self._server.kill()
            await self._server.wait()

    def pids(self) -> dict[int, str]:
        """The server process and its workers (the client, this process, is not counted)."""
        assert self._server is not None
        return {self._server.pid: "server", **{pid: _label(pid) for pid in descendant_pids(self._server.pid)}}

    async def one(self, request_id: str) -> StreamRecord:
        """Stream one utterance over HTTP."""
        body = {"model": MODEL, "input": "speak", "voice": "default", "response_format": "pcm",
                "stream_format": "audio"}
        record = StreamRecord(time.perf_counter())
        try:
            async with self._client.stream("POST", "/v1/audio/speech", json=body) as response:
                if response.status_code == 429:
                    record.outcome = "refused"
                elif response.status_code != 200:
                    record.outcome = "failed"
                    record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                else:
                    odd = 0
                    async for data in response.aiter_raw():
                        now = time.perf_counter()
                        samples, odd = divmod(odd + len(data), 2)
                        if samples:
                            record.arrivals.append((now, samples))
        except Exception as exc:  # noqa: BLE001 - a failed stream is a result, counted as such
            record.outcome, record.error = "failed", f"{type(exc).__name__}: {exc}"
        if record.outcome == "ok" and not record.arrivals:
            record.outcome, record.error = "failed", "the stream ended with no audio"
        record.finished = time.perf_counter()
        return record


def _label(pid: int) -> str:
    """A process's name for the CPU table: ``worker <process>`` from a worker's spec file, else the last
    word of its command line (a template's module), with its pid."""
    try:
        words = [w.strip() for w in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")]
    except OSError:
        return f"pid {pid}"
    words = [w for w in words if w]
    last = Path(words[-1]).name if words else "?"
    return f"worker {last.removesuffix('.spec')} ({pid})" if last.endswith(".spec") else f"{last[:40]} ({pid})"


def cpu_ticks(pids: dict[int, str]) -> dict[int, int]:
    """CPU ticks so far of each process that is still alive."""
    ticks = {}
    for pid in pids:
        try:
            ticks[pid] = proc_cpu_ticks(pid)
        except OSError:
            continue
    return ticks


async def run_load(one: OneStream, load: dict[str, Any], prefix: str, seed: int) -> tuple[list[StreamRecord], float]:
    """Drive ``one`` with ``load``: ``{"kind": "concurrency", "value": N, "rounds": R}`` (N clients, each
    streaming R utterances back to back) or ``{"kind": "rate", "value": r, "duration_s": D}`` (Poisson
    arrivals at r per second for D seconds, each stream on its own). Returns the streams and the wall
    time from the first request to the end of the last stream."""
    records: list[StreamRecord] = []

    async def client(name: str, count: int) -> None:
        for i in range(count):
            records.append(await one(f"{prefix}-{name}-{i}"))

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        if load["kind"] == "concurrency":
            for c in range(int(load["value"])):
                nursery.start_soon(client, f"c{c}", int(load["rounds"]))
        else:
            for i, offset in enumerate(load_offsets(load, seed)):
                await trio.sleep_until(started + offset)
                nursery.start_soon(client, f"p{i}", 1)
    return records, trio.current_time() - started


async def measure_load(driver: InProcessDriver | HttpDriver, load: dict[str, Any], prefix: str,
                       seed: int) -> tuple[list[StreamRecord], float, dict[str, float]]:
    """:func:`run_load` on ``driver``, with the CPU seconds each of its processes spent meanwhile."""
    pids = driver.pids()
    before = cpu_ticks(pids)
    records, wall = await run_load(driver.one, load, prefix, seed)
    after = cpu_ticks(pids)
    tick = os.sysconf("SC_CLK_TCK")
    cpu = {pids[pid]: (after[pid] - before[pid]) / tick for pid in before if pid in after}
    return records, wall, cpu
