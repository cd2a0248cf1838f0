"""Bad input from outside and from stage code: fuzzed control frames on the sockets, a transfer over
the per-transfer limit, an unsupported dtype, duplicate live request ids, a stream to an unknown stage.
Each one is refused where it enters, the process keeps running, and normal requests keep returning
correct results; afterwards the pipeline is idle and (autouse ``ipc_base``) nothing is left behind.

Sizes: 1,600 fuzzed frames to a worker's socket and 1,600 to the caller's, in bursts of 100,
interleaved with 32 normal requests (2 after each burst) and a background request loop; a 4 MiB tensor against a 1 MiB
limit.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio

import omni_trio as ot
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import MalformedMessage, decode, encode
from tests.placement import stage
from tests.process import helpers

FRAMES_PER_SOCKET = 1600
BURST = 100


def _valid_messages(stage_here: str) -> list[list[bytes]]:
    ref = {"kind": "stage_payload", "object_id": "ghost:payload:a:b:0"}
    return [
        encode(m.Abort(request_ids=("ghost",), token=0)),
        encode(m.DataAck(request_id="ghost", from_stage=stage_here, to_stage="a", object_id="o", success=True)),
        encode(m.Submit(request_id="ghost", to_stage=stage_here, data_ref=ref)),
        encode(m.DataReady(request_id="ghost", from_stage="a", to_stage=stage_here, chunk_id=3, data_ref=ref)),
        encode(m.StatsReply(token=1, stages={}, process="nobody")),
        encode(m.Complete(request_id="ghost", from_stage=stage_here, success=False, error="x")),
    ]


_WRONG_VALUES: list[Any] = [7, -1, "7", True, None, 1.5, [1], {"a": 1}, b"\x00", "", 2**63]


def _candidate(rng: random.Random, valid: list[list[bytes]]) -> list[bytes]:
    """One random, truncated or mistyped frame list."""
    kind = rng.randrange(6)
    tag, body = rng.choice(valid)[:2]
    if kind == 0:  # random bytes, one frame
        return [rng.randbytes(rng.randrange(0, 200))]
    if kind == 1:  # random frames
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(2, 5))]
    if kind == 2:  # a real message, truncated
        return [tag, body[: rng.randrange(0, len(body))]]
    if kind == 3:  # a real message with one field of the wrong type (or an extra field)
        fields = msgpack.unpackb(body)
        key = rng.choice([*fields, "surprise"])
        fields[key] = rng.choice(_WRONG_VALUES)
        return [tag, msgpack.packb(fields)]
    if kind == 4:  # a real body under an unknown or mangled tag
        return [rng.choice([b"submit_v2", b"", b"\xff\xfe", tag.upper(), tag[:-1]]), body]
    flipped = bytearray(body)  # a real message with a flipped byte
    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return [tag, bytes(flipped)]


def fuzz_frames(seed: int, n: int, stage_here: str) -> list[list[bytes]]:
    """``n`` frame lists that the codec rejects (candidates that happen to decode are skipped, so
    each frame sent must be logged exactly once as ``malformed_message_dropped``)."""
    rng = random.Random(seed)
    valid = _valid_messages(stage_here)
    frames: list[list[bytes]] = []
    while len(frames) < n:
        candidate = _candidate(rng, valid)
        try:
            decode(candidate)
        except MalformedMessage:
            frames.append(candidate)
    return frames


def dropped_lines(log: str, process: str) -> int:
    return sum(1 for line in log.splitlines() if "malformed_message_dropped" in line and f"process={process}" in line)


async def test_fuzzed_frames_on_worker_and_main_sockets(ipc_base: Path, tmp_path: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("a", "create_append", factory={"tag": "a"}, next="b"),  # in the caller's process
        stage("b", "create_append", factory={"tag": "b"}, process="p_b", terminal=True),
    )
    to_worker_frames = fuzz_frames(1, FRAMES_PER_SOCKET, "b")
    to_main_frames = fuzz_frames(2, FRAMES_PER_SOCKET, "a")
    log_path = tmp_path / "stderr.log"  # the workers' log, read while they run (see helpers.stderr_to)
    normal = 0
    background = 0
    links: list[helpers.RawPush] = []
    started = time.monotonic()
    try:
        with trio.fail_after(60), helpers.stderr_to(log_path):
            async with ot.open_pipeline(config) as pipeline:
                assert await pipeline.submit("before", "x") == {"trail": ["x", "a", "b"]}
                workers = helpers.worker_processes()
                ipc = helpers.ipc_dir(ipc_base)
                to_worker, to_main = helpers.RawPush(ipc / "p_b.sock"), helpers.RawPush(ipc / "main.sock")
                links += [to_worker, to_main]
                # Sealed with the run's secret: past the proof check, the decoder must refuse each one.
                auth = helpers.run_auth(ipc)
                stop = trio.Event()

                async def keep_submitting() -> None:
                    nonlocal background
                    while not stop.is_set():
                        rid = f"bg-{background}"
                        assert await pipeline.submit(rid, rid) == {"trail": [rid, "a", "b"]}
                        background += 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(keep_submitting)
                    for burst in range(0, FRAMES_PER_SOCKET, BURST):
                        for i in range(burst, burst + BURST):
                            await to_worker.send_multipart(auth.seal(to_worker_frames[i]))
                            await to_main.send_multipart(auth.seal(to_main_frames[i]))
                        for j in range(2):  # normal traffic between the bursts
                            rid = f"mid-{burst}-{j}"
                            assert await pipeline.submit(rid, rid) == {"trail": [rid, "a", "b"]}
                            normal += 1
                    # Each process logs every frame it drops: wait until both logged all of them.
                    while min(dropped_lines(log := log_path.read_text(errors="replace"), "main"),
                              dropped_lines(log, "p_b")) < FRAMES_PER_SOCKET:
                        await trio.sleep(0.02)
                    stop.set()
                for i in range(5):
                    assert await pipeline.submit(f"after-{i}", f"y{i}") == {"trail": [f"y{i}", "a", "b"]}
                assert helpers.worker_processes() == workers  # same worker, same pid: it never died
                stats = await pipeline.stats()
                assert stats.idle, stats
                assert stats.refused_frames == {"main": 0, "p_b": 0}  # they carried the run's proof
    finally:
        for link in links:
            link.close()
    elapsed = time.monotonic() - started
    log = log_path.read_text(errors="replace")  # the worker has exited: its stderr is complete
    assert dropped_lines(log, "main") == FRAMES_PER_SOCKET, "each bad frame is logged exactly once"
    assert dropped_lines(log, "p_b") == FRAMES_PER_SOCKET
    assert "socket=" in next(line for line in log.splitlines() if "malformed_message_dropped" in line)
    print(f"\nFIGURES fuzz_frames: frames_total={2 * FRAMES_PER_SOCKET} to_worker={FRAMES_PER_SOCKET} "
          f"to_main={FRAMES_PER_SOCKET} logged_main={dropped_lines(log, 'main')} "
          f"logged_worker={dropped_lines(log, 'p_b')} normal_requests_interleaved={normal} "
          f"background_requests={background} worker_restarts=0 elapsed_s={elapsed:.2f}")


async def test_transfer_limit_and_unsupported_dtype_fail_only_their_request(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("src", "create_tensor_of", process="p_src", next="sum", comm=ot.CommConfig(slot_size_mb=1)),
        stage("sum", "create_sum_tensor", process="p_sum", terminal=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            assert await pipeline.submit("ok-0", "x", params={"numel": 200_000}) == {"sum": 0.0, "numel": 200_000}

            with pytest.raises(ot.RequestFailed) as too_large:  # 4 MiB against a 1 MiB limit
                await pipeline.submit("big", "x", params={"numel": 1 << 20})
            assert too_large.value.stage == "src"
            message = str(too_large.value)
            assert "max_transfer_bytes" in message and "limit" in message and str(1 << 20) in message, message
            assert (await pipeline.stats()).idle

            with pytest.raises(ot.RequestFailed) as bad_dtype:
                await pipeline.submit("u16", "x", params={"dtype": "uint16", "numel": 8})
            assert bad_dtype.value.stage == "src"  # refused at the sender: nothing reached 'sum'
            assert "unsupported dtype torch.uint16" in str(bad_dtype.value), str(bad_dtype.value)
            assert (await pipeline.stats()).idle

            # Still serving: inline, shared memory just under the limit, and another dtype.
            assert await pipeline.submit("ok-1", "x", params={"numel": 16}) == {"sum": 0.0, "numel": 16}
            assert await pipeline.submit("ok-2", "x", params={"numel": 250_000}) == {"sum": 0.0, "numel": 250_000}
            assert await pipeline.submit("ok-3", "x", params={"numel": 9, "dtype": "int16"}) == {"sum": 0.0,
                                                                                                  "numel": 9}
            stats = await pipeline.stats()
            assert stats.idle, stats
    print(f"\nFIGURES limits: slot_size_mb=1 refused_bytes={4 << 20} refused_dtype=torch.uint16 "
          f"error={message!r}")


async def test_duplicate_live_ids_and_stream_to_unknown_stage(ipc_base: Path) -> None:
    config = helpers.config(
        ipc_base,
        stage("t", "create_targeted_streamer", process="p_t", next="slow"),
        stage("slow", "create_block_until_aborted", process="p_slow", terminal=True),
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            first: list[BaseException] = []

            async def hold() -> None:
                try:
                    await pipeline.submit("dup", "x")  # blocks in 'slow' until aborted
                except ot.RequestAborted as exc:
                    first.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                while (await pipeline.stats()).stages["slow"].active_requests == 0:
                    await trio.sleep(0.01)
                for _ in range(50):  # a burst of duplicates of a live id: each refused, nothing sent
                    with pytest.raises(ot.DuplicateRequestId):
                        await pipeline.submit("dup", "other")
                with pytest.raises(ot.DuplicateRequestId):
                    async with pipeline.stream("dup", "other") as events:
                        async for _ in events:
                            pass
                assert (await pipeline.stats()).stages["slow"].active_requests == 1
                assert await pipeline.abort("dup") is True
            assert len(first) == 1

            with pytest.raises(ot.RequestFailed) as unknown:
                await pipeline.submit("to-nowhere", "x", params={"target": "nowhere", "block": False})
            assert unknown.value.stage == "t"
            assert "unknown stage 'nowhere'" in str(unknown.value), str(unknown.value)

            assert await pipeline.submit("fine", "x", params={"block": False}) == {"trail": ["slow"]}
            stats = await pipeline.stats()
            assert stats.idle, stats
    print(f"\nFIGURES ids_and_targets: duplicate_submits_refused=50 duplicate_streams_refused=1 "
          f"unknown_target_error={str(unknown.value)!r}")
