"""Worker processes: death, start-up failures, hostile frames, caller errors and cancellation.

After every test the autouse fixture of conftest.py checks that no IPC
directory, shared-memory segment or worker process was left behind.
"""

from __future__ import annotations

import functools
import os
import pickle
import random
import signal
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.comm.dataref import BufferRef, DataRef, DataRefKind, Layout, TransportKind
from omni_trio.control import aborts as aborts_module
from omni_trio.control import dispatch as dispatch_module
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import encode
from omni_trio.runtime.workers import supervisor as supervisor_module
from tests.placement import stage
from tests.process import helpers


def blocker(process: str = "p_block") -> ot.StageConfig:
    """A terminal stage that reports its pid (to the ``pid_file`` param) and blocks until aborted."""
    return stage("blocker", "create_block_and_report_pid", process=process, terminal=True)


# ---------------------------------------------------------------------------- a worker dies


async def test_sigkilled_worker_fails_its_requests_within_a_second(ipc_base: Path, tmp_path: Path) -> None:
    config = helpers.config(ipc_base, blocker())
    failures: dict[str, tuple[ot.StageProcessDied, float]] = {}
    pid_file = tmp_path / "pid"  # written by whichever request the blocker takes first

    async def submit(pipeline: ot.Pipeline, request_id: str) -> None:
        try:
            await pipeline.submit(request_id, "x", params={"pid_file": str(pid_file)})
        except ot.StageProcessDied as exc:
            failures[request_id] = (exc, trio.current_time())

    with trio.fail_after(30), pytest.raises(ot.StageProcessDied) as ended:
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            nursery.start_soon(submit, pipeline, "r0")
            nursery.start_soon(submit, pipeline, "r1")  # queued behind the first one in the same stage
            pid = int(await helpers.wait_for_file(pid_file))
            assert pid in helpers.worker_processes()
            killed_at = trio.current_time()
            os.kill(pid, signal.SIGKILL)
            await trio.sleep_forever()  # the pipeline ends itself

    assert sorted(failures) == ["r0", "r1"]
    for request_id, (error, failed_at) in failures.items():
        assert failed_at - killed_at < 1.0, f"{request_id} failed {failed_at - killed_at:.3f} s after the kill"
        assert error.request_id == request_id
        assert (error.process, error.pid, error.returncode) == ("p_block", pid, -signal.SIGKILL)
        assert "p_block" in str(error) and str(pid) in str(error) and "SIGKILL" in str(error)
    final = ended.value
    assert (final.process, final.pid, final.returncode) == ("p_block", pid, -signal.SIGKILL)
    assert "SIGKILL" in str(final)
    assert pid not in helpers.worker_processes()


# ---------------------------------------------------------------------------- start-up failures


async def test_factory_failure_in_a_worker_fails_open_pipeline(ipc_base: Path) -> None:
    config = helpers.config(ipc_base, stage("b", "create_factory_fails", process="p_b", terminal=True))
    with trio.fail_after(30), pytest.raises(ot.StageStartupError, match="'p_b'"):
        async with ot.open_pipeline(config):
            pytest.fail("the pipeline must not start")


async def test_warm_up_failure_in_a_worker_fails_open_pipeline(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("a", "create_passthrough", process="p_a", next="b"),
        stage("b", "create_warm_up_fails", process="p_b", terminal=True),
    )
    with trio.fail_after(30), pytest.raises(ot.StageStartupError, match="'p_b'") as info:
        async with ot.open_pipeline(config):
            pytest.fail("the pipeline must not start")
    assert "'p_a'" not in str(info.value)  # the healthy worker is not blamed


@pytest.mark.parametrize(
    ("factory", "text"),
    [("create_factory_fails", "factory cannot build this stage"), ("create_warm_up_fails", "no weights here")],
)
async def test_startup_failure_carries_the_child_traceback(ipc_base: Path, factory: str, text: str) -> None:
    config = helpers.config(ipc_base, stage("b", factory, process="p_b", terminal=True))
    with trio.fail_after(30), pytest.raises(ot.StageStartupError) as info:
        async with ot.open_pipeline(config):
            pytest.fail("the pipeline must not start")
    message = str(info.value)
    assert "'p_b'" in message
    assert "Traceback (most recent call last)" in message and "tests/stages.py" in message, message
    assert text in message


# ---------------------------------------------------------------------------- hostile frames


def _inline_ref(header: bytes, object_id: str = "ghost:payload:a:b:0") -> dict[str, Any]:
    ref = DataRef(kind=DataRefKind.stage_payload, object_id=object_id, transport=TransportKind.inline,
                  layout=Layout.packed_tensors, header=header)
    return ref.to_wire()


def _shm_ref(name: str) -> dict[str, Any]:
    ref = DataRef(kind=DataRefKind.stage_payload, object_id="ghost:payload:a:b:1", transport=TransportKind.shm,
                  layout=Layout.packed_tensors, header=pickle.dumps(None),
                  buffer=BufferRef(transport=TransportKind.shm, info={"shm_name": name, "size": 8}, length=8))
    return ref.to_wire()


def malformed_frames() -> list[list[bytes]]:
    """Frames the codec must reject (each is logged and dropped by the receiver)."""
    body = msgpack.packb({"request_id": "ghost", "from_stage": "a", "to_stage": "b", "data_ref": _inline_ref(b"x")})
    rng = random.Random(1234)
    return [
        [rng.randbytes(64)],  # one frame of random bytes
        [rng.randbytes(16), rng.randbytes(300)],  # random tag and body
        [b"data_ready", body[: len(body) // 2]],  # truncated msgpack
        [b"no_such_message", msgpack.packb({})],  # unknown tag
        [b"\xff\xfe\x00", msgpack.packb({})],  # non-ASCII tag
        [b"", b""],  # empty frames
        [b"data_ready", msgpack.packb([1, 2, 3])],  # body is not a map
        [b"data_ready", msgpack.packb({"request_id": 7, "from_stage": "a", "to_stage": "b", "data_ref": "x"})],
        [b"data_ack", msgpack.packb({"request_id": "ghost", "from_stage": "b", "to_stage": "a",
                                     "object_id": "o", "success": 1})],  # an int is not a bool
        [b"submit", msgpack.packb({"request_id": "ghost"})],  # valid tag, missing fields
        [b"abort", msgpack.packb({"request_id": "ghost", "surprise": True})],  # an extra field
        [b"abort", msgpack.packb({"request_id": "ghost"}), b"unreferenced frame"],
        [b"data_ready", msgpack.packb({"request_id": "", "from_stage": "a", "to_stage": "b",
                                       "data_ref": _inline_ref(b"x")})],  # empty request id
        [b"data_ready", msgpack.packb({"request_id": "g", "from_stage": "a", "to_stage": "b", "is_done": True,
                                       "error": "both"})],  # violates an invariant
    ]


def undeliverable_messages(stage_here: str, run_prefix: str) -> list[list[bytes]]:
    """Well-formed messages that make no sense to the receiver (each is logged and dropped,
    or ignored); ``stage_here`` is a stage the receiving process hosts."""
    missing_segments = [f"{run_prefix}-7-123456", "omnitrio-other-run-0-0", "../../../etc/passwd"]
    return [
        *(encode(m.DataReady(request_id=f"ghost-shm-{i}", from_stage="a", to_stage=stage_here, data_ref=_shm_ref(name)))
          for i, name in enumerate(missing_segments)),
        encode(m.DataReady(request_id="ghost", from_stage="a", to_stage="nowhere", data_ref=_inline_ref(b"x"))),
        encode(m.DataReady(request_id="ghost-1", from_stage="a", to_stage=stage_here, data_ref={"bogus": 1})),
        encode(m.DataReady(request_id="ghost-2", from_stage="a", to_stage=stage_here, data_ref=_inline_ref(b"junk"))),
        encode(m.DataAck(request_id="ghost", from_stage=stage_here, to_stage="a", object_id="nope", success=True)),
        encode(m.Submit(request_id="ghost-4", to_stage="nowhere", data_ref=_inline_ref(b"x"))),
        encode(m.Ready(process="nobody", stages=["x"])),
        encode(m.StatsReply(token=987654, stages={}, process="nobody")),
        encode(m.Complete(request_id="ghost-5", from_stage=stage_here, success=False, error="forged")),
        encode(m.Complete(request_id="ghost-6", from_stage=stage_here, success=True, data_ref=_inline_ref(b"junk"))),
        encode(m.Stream(request_id="ghost-7", from_stage=stage_here, chunk_id=0, data_ref=_inline_ref(b"junk"))),
    ]


class LogRecorder:
    """Stands in for a module's structlog logger and records the events logged."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def record(event: str, **fields: Any) -> None:
            self.events.append((event, fields))
            getattr(self._real, level)(event, **fields)

        return record

    def count(self, *names: str, process: str) -> int:
        return sum(1 for event, fields in self.events if event in names and fields.get("process") == process)


async def test_garbage_frames_are_dropped_and_the_pipeline_keeps_serving(
    ipc_base: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recorder = LogRecorder(dispatch_module.log)
    monkeypatch.setattr(dispatch_module, "log", recorder)  # the main process's endpoint logs here
    config = helpers.config(
        ipc_base,
        stage("a", "create_append", factory={"tag": "a"}, next="b"),  # in the caller's process
        stage("b", "create_append", factory={"tag": "b"}, process="p_b", terminal=True),
    )
    bad = malformed_frames()
    log_path = tmp_path / "stderr.log"  # the worker's log, read while it runs (see helpers.stderr_to)
    links: list[helpers.RawPush] = []
    try:
        with trio.fail_after(30), helpers.stderr_to(log_path):
            async with ot.open_pipeline(config) as pipeline:
                assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
                workers = helpers.worker_processes()
                assert len(workers) == 1
                ipc = helpers.ipc_dir(ipc_base)
                to_worker, to_main = helpers.RawPush(ipc / "p_b.sock"), helpers.RawPush(ipc / "main.sock")
                links += [to_worker, to_main]
                prefix = helpers.run_prefix(ipc)
                # Sealed with the run's secret: these get past the proof check, to the decoder and handlers.
                auth = helpers.run_auth(ipc)
                for frames in [*bad, *undeliverable_messages("b", prefix)]:
                    await to_worker.send_multipart(auth.seal(frames))
                for frames in [*bad, *undeliverable_messages("a", prefix)]:
                    await to_main.send_multipart(auth.seal(frames))

                # The worker handles the messages of one connection in order and logs each bad one:
                # once it logged the last one, it has handled all of them.
                while "Stream is not expected by process 'p_b'" not in log_path.read_text(errors="replace"):
                    await trio.sleep(0.01)
                while recorder.count("malformed_message_dropped", process="main") < len(bad):
                    await trio.sleep(0.01)

                # Still serving, correctly, from the same processes.
                for i in range(3):
                    assert await pipeline.submit(f"after-{i}", f"y{i}") == {"trail": [f"y{i}", "a", "b"]}
                async with pipeline.stream("after-stream", "z") as events:
                    assert [e.result async for e in events] == [{"trail": ["z", "a", "b"]}]
                assert helpers.worker_processes() == workers
                stats = await pipeline.stats()
                assert stats.idle
                assert stats.refused_frames == {"main": 0, "p_b": 0}  # they carried the run's proof
    finally:
        for link in links:
            link.close()

    assert recorder.count("malformed_message_dropped", process="main") == len(bad)
    assert recorder.count("message_dropped", process="main") >= 2  # unknown stage 'nowhere', bad data_ref map
    worker_log = log_path.read_text(errors="replace")
    dropped = [line for line in worker_log.splitlines() if "malformed_message_dropped" in line and "p_b" in line]
    assert len(dropped) == len(bad), worker_log
    assert "stage 'nowhere' does not run in process 'p_b'" in worker_log


# ---------------------------------------------------------------------------- the caller leaves


class CallerError(Exception):
    pass


async def test_caller_exception_propagates_unchanged_and_workers_stop(ipc_base: Path, tmp_path: Path) -> None:
    config = helpers.config(ipc_base, stage("a", "create_append", factory={"tag": "a"}, process="p_a", next="blocker"),
                            blocker())
    error = CallerError("mine")
    seen: list[BaseException] = []
    in_flight: list[BaseException] = []

    async def submit(pipeline: ot.Pipeline) -> None:
        try:
            await pipeline.submit("r0", "x", params={"pid_file": str(tmp_path / "pid")})
        except ot.RequestAborted as exc:
            in_flight.append(exc)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:  # outlives the pipeline: holds the in-flight request
            try:
                async with ot.open_pipeline(config) as pipeline:
                    nursery.start_soon(submit, pipeline)
                    await helpers.wait_for_file(tmp_path / "pid")  # r0 is held by the blocker's worker
                    assert len(helpers.worker_processes()) == 2
                    raise error
            except BaseException as exc:  # noqa: BLE001 - inspected below
                seen.append(exc)
                assert helpers.worker_processes() == {}  # gone by the time the block has exited
    assert len(seen) == 1 and seen[0] is error
    assert seen[0].__traceback__ is not None
    # The request the caller left behind was aborted, not left hanging.
    assert len(in_flight) == 1 and in_flight[0].request_id == "r0"


async def test_caller_exception_group_propagates_unchanged(ipc_base: Path) -> None:
    config = helpers.config(ipc_base, stage("a", "create_passthrough", process="p_a", terminal=True))
    group = ExceptionGroup("the caller's own group", [CallerError("inside")])
    seen: list[BaseException] = []
    with trio.fail_after(30):
        try:
            async with ot.open_pipeline(config):
                raise group
        except BaseException as exc:  # noqa: BLE001 - inspected below
            seen.append(exc)
    # trio's nursery re-derives a group passing through it; what the caller raised is kept.
    assert len(seen) == 1 and type(seen[0]) is ExceptionGroup
    assert seen[0].message == "the caller's own group"
    assert len(seen[0].exceptions) == 1 and seen[0].exceptions[0] is group.exceptions[0]


@pytest.fixture
def short_stop_timeouts(monkeypatch: pytest.MonkeyPatch) -> float:
    """Shorter waits for abort confirmations and graceful worker exits, so that a shutdown that
    misses them is both detectable and quick; returns the time a clean shutdown must beat."""
    monkeypatch.setattr(aborts_module, "WAIT_BOUND_S", 1.0)
    monkeypatch.setattr(supervisor_module, "GRACEFUL_STOP_S", 3.0)
    monkeypatch.setattr(supervisor_module, "FIRM_STOP_S", 1.0)
    return 2.5


async def test_cancelling_the_caller_mid_request_shuts_down_cleanly(
    ipc_base: Path, tmp_path: Path, short_stop_timeouts: float
) -> None:
    config = helpers.config(ipc_base, blocker())
    try:
        with trio.fail_after(30):
            with trio.move_on_after(25) as scope:
                async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                    params = {"pid_file": str(tmp_path / "pid")}
                    nursery.start_soon(functools.partial(pipeline.submit, "r0", "x", params=params))
                    pid = int(await helpers.wait_for_file(tmp_path / "pid"))
                    assert pid in helpers.worker_processes()
                    scope.deadline = trio.current_time()  # as if the caller's timeout expired now
                    cancelled_at = trio.current_time()
                    await trio.sleep_forever()
            stopped_in = trio.current_time() - cancelled_at
        assert scope.cancelled_caught
        assert helpers.worker_processes() == {}
        # Graceful: the abort reached the worker (releasing the blocked stage) and so did Shutdown.
        assert stopped_in < short_stop_timeouts, f"shutdown took {stopped_in:.2f} s"
    finally:
        helpers.kill_workers()  # never leave a worker behind, even if the test fails


async def test_a_dead_worker_stops_the_other_workers_cleanly(
    ipc_base: Path, tmp_path: Path, short_stop_timeouts: float
) -> None:
    config = helpers.config(
        ipc_base,
        stage("a", "create_append", factory={"tag": "a"}, process="p_a", next="blocker"),
        blocker(),
    )
    lost: list[ot.StageProcessDied] = []

    async def submit(pipeline: ot.Pipeline) -> None:
        try:
            await pipeline.submit("r0", "x", params={"pid_file": str(tmp_path / "pid")})
        except ot.StageProcessDied as exc:
            lost.append(exc)

    try:
        with trio.fail_after(30), pytest.raises(ot.StageProcessDied) as ended:
            async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
                nursery.start_soon(submit, pipeline)
                pid = int(await helpers.wait_for_file(tmp_path / "pid"))
                os.kill(pid, signal.SIGKILL)
                killed_at = trio.current_time()
                await trio.sleep_forever()
        stopped_in = trio.current_time() - killed_at
        assert (ended.value.process, ended.value.pid) == ("p_block", pid)
        assert [error.request_id for error in lost] == ["r0"]
        assert helpers.worker_processes() == {}  # p_a was stopped too...
        assert stopped_in < short_stop_timeouts, f"shutdown took {stopped_in:.2f} s"  # ...by its Shutdown message
    finally:
        helpers.kill_workers()
