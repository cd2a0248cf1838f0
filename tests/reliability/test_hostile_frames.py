"""Frames cannot run code: what a same-user process that can connect to a run's sockets (but does not
hold the run's secret) can send, and what the run does with it.

- A frame whose pickled header would run code (create a marker directory), to a worker and to the
  caller: nothing runs, each is counted as refused, both keep serving.
- Forged, garbage, tampered and replayed-from-another-run frames (genuine messages sealed with a
  second, concurrently running pipeline's secret): refused N of N, counted per process in
  ``stats().refused_frames``, nothing of them reaches a decoder.
- ``StatsRequest.reply_to``: a path (``../``) or a name that is no process of the run opens no socket
  and leaves the run's directory never, even with the run's proof; the worker's open files stay flat.
- ``endpoints.max_message_bytes``: a frame above it does not grow the worker's memory and the worker
  keeps serving; a stage that would send one fails its request with ``MessageTooLarge``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
import socket
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

import omni_trio as ot
from omni_trio.comm.dataref import DataRef, DataRefKind, Layout, TransportKind
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.auth import FrameMac
from omni_trio.control.wire.codec import encode
from omni_trio.payload import OmniRequest, StagePayload
from tests.placement import stage
from tests.process import helpers


class _RunsCode:
    """Unpickling this calls ``os.mkdir(marker)``: what an attacker's pickled header would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _inline(header: bytes, object_id: str) -> dict[str, Any]:
    return DataRef(kind=DataRefKind.stage_payload, object_id=object_id, transport=TransportKind.inline,
                   layout=Layout.packed_tensors, header=header).to_wire()


def _payload_header(request_id: str) -> bytes:
    """A genuine inline payload header (what a real sender writes for a StagePayload)."""
    from omni_trio.comm.transfer import encode_inline

    ref = encode_inline(StagePayload(request_id, OmniRequest(request_id), {}), sender="a", target="b",
                        object_id=f"{request_id}:payload:a:b:0", kind=DataRefKind.stage_payload)
    assert ref is not None and ref.header is not None
    return ref.header


def _two_stages(base: Path, **endpoints: Any) -> ot.PipelineConfig:
    return ot.PipelineConfig(
        stages=[
            stage("a", "create_append", factory={"tag": "a"}, next="b"),  # in the caller's process
            stage("b", "create_append", factory={"tag": "b"}, process="p_b", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=str(base), **endpoints),
    )


def _worker_pid() -> int:
    (pid,) = helpers.worker_processes()
    return pid


async def _refused(pipeline: ot.Pipeline, want: dict[str, int]) -> dict[str, int]:
    """Wait until every process in ``want`` refused at least that many frames; return the counts."""
    while True:
        counts = (await pipeline.stats()).refused_frames
        if all(counts.get(process, 0) >= n for process, n in want.items()):
            return counts
        await trio.sleep(0.01)


def _push(links: list[helpers.RawPush], path: Path) -> helpers.RawPush:
    link = helpers.RawPush(path)
    links.append(link)
    return link


def _close(links: list[helpers.RawPush]) -> None:
    for link in links:
        link.close()


async def test_a_frame_whose_header_would_run_code_runs_nothing(ipc_base: Path) -> None:
    marker = ipc_base / "pwned"
    evil = pickle.dumps(_RunsCode(marker))
    to_worker_frames = [
        encode(m.Submit(request_id=f"evil-s{i}", to_stage="b", data_ref=_inline(evil, f"evil-s{i}:payload:x:b:0")))
        for i in range(20)
    ] + [
        encode(m.DataReady(request_id=f"evil-d{i}", from_stage="a", to_stage="b",
                           data_ref=_inline(evil, f"evil-d{i}:payload:a:b:0")))
        for i in range(20)
    ]
    to_main_frames = [
        encode(m.Complete(request_id=f"evil-c{i}", from_stage="b", success=True,
                          data_ref=_inline(evil, f"evil-c{i}:result:b:coordinator:0")))
        for i in range(20)
    ]
    links: list[helpers.RawPush] = []
    try:
        with trio.fail_after(60):
            async with ot.open_pipeline(_two_stages(ipc_base)) as pipeline:
                assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
                pid = _worker_pid()
                ipc = helpers.ipc_dir(ipc_base)
                to_worker, to_main = _push(links, ipc / "p_b.sock"), _push(links, ipc / "main.sock")
                for frames in to_worker_frames:
                    await to_worker.send_multipart(frames)
                for frames in to_main_frames:
                    await to_main.send_multipart(frames)
                counts = await _refused(pipeline, {"p_b": len(to_worker_frames), "main": len(to_main_frames)})
                assert counts == {"main": len(to_main_frames), "p_b": len(to_worker_frames)}
                assert not marker.exists(), "a frame from outside the run had its header unpickled"
                for i in range(3):  # still serving, from the same worker
                    assert await pipeline.submit(f"after-{i}", f"y{i}") == {"trail": [f"y{i}", "a", "b"]}
                assert _worker_pid() == pid
                assert (await pipeline.stats()).idle
    finally:
        _close(links)
    assert not marker.exists()
    print(f"\nFIGURES code_frames: sent={len(to_worker_frames) + len(to_main_frames)} "
          f"refused_worker={counts['p_b']} refused_main={counts['main']} code_ran=0")


#: Each genuine message is forged six ways per round.
ROUNDS = 10


def _hostile(rng: random.Random, genuine: list[list[bytes]], ours: FrameMac, theirs: FrameMac) -> list[list[bytes]]:
    """One of each kind per genuine message: no proof, garbage proof, another run's proof, tampered
    body, moved frame boundary, and random garbage frames."""
    frames: list[list[bytes]] = []
    for message in genuine:
        sealed = [bytes(f) for f in ours.seal(message)]
        flipped = bytearray(sealed[1])
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        frames += [
            message,
            [*message, rng.randbytes(16)],
            [bytes(f) for f in theirs.seal(message)],  # genuine in the other run: replayed here
            [sealed[0], bytes(flipped), *sealed[2:]],
            [sealed[0] + sealed[1][:1], sealed[1][1:], *sealed[2:]],
            [rng.randbytes(rng.randrange(0, 80)) for _ in range(rng.randrange(1, 5))],
        ]
    return frames


async def test_forged_garbage_and_other_runs_frames_are_refused_n_of_n(
    ipc_base: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    other_base = ipc_base / "other"
    other_base.mkdir()
    rng = random.Random(12)
    links: list[helpers.RawPush] = []
    try:
        with trio.fail_after(90):
            async with (
                ot.open_pipeline(_two_stages(ipc_base)) as pipeline,
                ot.open_pipeline(_two_stages(other_base)) as other,
            ):
                ipc, other_ipc = helpers.ipc_dir(ipc_base), helpers.ipc_dir(other_base)
                ours, theirs = helpers.run_auth(ipc), helpers.run_auth(other_ipc)
                assert ours.secret != theirs.secret
                pid = next(p for p, cmd in helpers.worker_processes().items() if str(ipc) in cmd)
                # Messages each process would act on, were they sealed with its run's secret.
                to_worker = [
                    encode(m.Submit(request_id=f"g{i}", to_stage="b", data_ref=_inline(_payload_header(f"g{i}"),
                                                                                      f"g{i}:submit:c:b:0")))
                    for i in range(10)
                ] + [
                    encode(m.DataReady(request_id="g", from_stage="a", to_stage="b", is_done=True)),
                    encode(m.Abort(request_ids=("before",), token=1)),
                    encode(m.StatsRequest(reply_to="main", token=1)),
                    encode(m.Shutdown()),
                ]
                to_main = [
                    encode(m.Complete(request_id="g", from_stage="b", success=False, error="forged")),
                    encode(m.Ready(process="p_b", stages=["b"])),
                    encode(m.StatsReply(token=0, stages={}, process="p_b", refused_frames=0)),
                    encode(m.AbortDone(token=2, process="p_b")),
                ]
                worker_frames = [f for _ in range(ROUNDS) for f in _hostile(rng, to_worker, ours, theirs)]
                main_frames = [f for _ in range(ROUNDS) for f in _hostile(rng, to_main, ours, theirs)]
                worker_sock, main_sock = _push(links, ipc / "p_b.sock"), _push(links, ipc / "main.sock")
                for frames in worker_frames:
                    await worker_sock.send_multipart(frames)
                for frames in main_frames:
                    await main_sock.send_multipart(frames)
                counts = await _refused(pipeline, {"p_b": len(worker_frames), "main": len(main_frames)})
                assert counts == {"main": len(main_frames), "p_b": len(worker_frames)}, counts
                assert (await other.stats()).refused_frames == {"main": 0, "p_b": 0}
                # Nothing was acted on: the Shutdown did not stop the worker, both runs serve.
                assert await pipeline.submit("after", "y") == {"trail": ["y", "a", "b"]}
                assert await other.submit("after", "z") == {"trail": ["z", "a", "b"]}
                assert pid in helpers.worker_processes()
                stats = await pipeline.stats()
                assert stats.idle, stats
    finally:
        _close(links)
    log = capfd.readouterr().err
    # Refused before decoding: no decoder or handler ever saw one of them.
    assert "malformed_message_dropped" not in log and "message_dropped" not in log, log
    # The log is bounded: a warning at the 1st, 2nd, 4th... refusal, with the running count.
    warned = [int(n) for n in re.findall(r"frame_refused.*process=p_b.*refused=(\d+)", log)]
    assert warned and all(n & (n - 1) == 0 for n in warned), warned
    total = len(worker_frames) + len(main_frames)
    print(f"\nFIGURES forged_frames: sent={total} refused={counts['p_b'] + counts['main']} of {total} "
          f"(worker {counts['p_b']}, caller {counts['main']}) kinds=no_proof,garbage_proof,other_run,"
          f"tampered,moved_boundary,random log_lines_worker={len(warned)}")


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_reply_to_cannot_leave_the_run_or_open_sockets(ipc_base: Path, tmp_path: Path) -> None:
    escapes = ["../evil", "../../evil", "/tmp/evil", "a/b", "..", "", "main/../../evil", "p_b/../main", "x" * 200]
    names = [f"probe-{i}" for i in range(300)]  # well-formed, but no process of the run
    links: list[helpers.RawPush] = []
    evil = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    evil.setblocking(False)
    evil.bind(str(ipc_base / "evil.sock"))  # where "../evil" led outside the private directory
    evil.listen()
    log_path = tmp_path / "stderr.log"
    try:
        with trio.fail_after(60), helpers.stderr_to(log_path):
            async with ot.open_pipeline(_two_stages(ipc_base)) as pipeline:
                assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
                pid = _worker_pid()
                ipc = helpers.ipc_dir(ipc_base)
                auth = helpers.run_auth(ipc)
                before = _open_files(pid)
                sock = _push(links, ipc / "p_b.sock")
                for i, reply_to in enumerate(escapes):
                    # Sealed: even with the run's proof, the field is validated before it names a path.
                    body = msgpack.packb({"reply_to": reply_to, "token": i})
                    await sock.send_multipart(auth.seal([b"stats_request", body]))
                for i, name in enumerate(names):
                    await sock.send_multipart(auth.seal(encode(m.StatsRequest(reply_to=name, token=1000 + i))))
                    await sock.send_multipart(encode(m.StatsRequest(reply_to=name, token=2000 + i)))  # no proof
                await _refused(pipeline, {"p_b": len(names)})
                while log_path.read_text(errors="replace").count("is not a process of this run") < len(names):
                    await trio.sleep(0.01)
                grown = _open_files(pid) - before
                assert grown <= 4, f"the worker opened {grown} files for stats requests"
                with pytest.raises(BlockingIOError):  # nobody connected there
                    evil.accept()
                assert await pipeline.submit("after", "y") == {"trail": ["y", "a", "b"]}
                stats = await pipeline.stats()
                assert stats.idle and stats.refused_frames["p_b"] == len(names)
    finally:
        _close(links)
        evil.close()
    log = log_path.read_text(errors="replace")
    refused_paths = [line for line in log.splitlines() if "malformed_message_dropped" in line and "reply_to" in line]
    assert len(refused_paths) == len(escapes), log
    print(f"\nFIGURES reply_to: path_values_refused={len(refused_paths)} of {len(escapes)} "
          f"unknown_names_refused={log.count('is not a process of this run')} of {len(names)} "
          f"unsealed_refused={stats.refused_frames['p_b']} of {len(names)} worker_fds_grown={grown}")


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    (kib,) = re.findall(r"VmHWM:\s+(\d+) kB", status)
    return int(kib) / 1024


async def test_a_frame_over_the_size_cap_does_not_grow_the_worker(ipc_base: Path) -> None:
    cap = 1 << 20
    huge = 128 << 20
    links: list[helpers.RawPush] = []
    try:
        with trio.fail_after(60):
            async with ot.open_pipeline(_two_stages(ipc_base, max_message_bytes=cap)) as pipeline:
                assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
                pid = _worker_pid()
                ipc = helpers.ipc_dir(ipc_base)
                auth = helpers.run_auth(ipc)
                peak_before = _peak_rss_mib(pid)
                for kind in range(2):  # with and without the run's proof: refused unread either way
                    sock = _push(links, ipc / "p_b.sock")
                    frames = [b"data_ready", b"\0" * huge]
                    # The worker drops the connection as soon as it reads the frame's size.
                    with contextlib.suppress(trio.BrokenResourceError):
                        await sock.send_multipart(auth.seal(frames) if kind else frames)
                    await sock.wait_disconnected()
                    sock.close()
                    assert await pipeline.submit(f"mid-{kind}", "y") == {"trail": ["y", "a", "b"]}
                assert (await pipeline.stats()).refused_frames["p_b"] == 2  # counted as refused
                peak_after = _peak_rss_mib(pid)
                assert peak_after - peak_before < 32, (peak_before, peak_after)
                # Our own sender refuses what the receiver would: the stage fails the request, clearly.
                with pytest.raises(ot.RequestFailed) as too_large:
                    await pipeline.submit("big", "x" * (2 * cap))
                assert too_large.value.stage == "a"
                assert "MessageTooLarge" in str(too_large.value) and "max_message_bytes" in str(too_large.value)
                assert await pipeline.submit("after", "z") == {"trail": ["z", "a", "b"]}
                assert _worker_pid() == pid
                assert (await pipeline.stats()).idle
    finally:
        _close(links)
    print(f"\nFIGURES size_cap: cap_bytes={cap} frame_bytes={huge} worker_peak_rss_mib before={peak_before:.0f} "
          f"after={peak_after:.0f} sender_error={str(too_large.value)[:120]!r}")
