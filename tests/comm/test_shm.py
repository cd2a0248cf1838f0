"""The shared-memory relay: segments, per-target credits, cleanup."""

from __future__ import annotations

import hashlib
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import trio
import trio.testing

from omni_trio.comm.oneshot import read_segment
from omni_trio.comm.packing import pack_tensors, unpack_tensors, write_packed
from omni_trio.comm.segments import OFF_THREAD_BYTES, SHM_DIR, SegmentNotFound, remove_segments
from omni_trio.comm.shm import ShmPut, ShmRelay, TransferTooLarge
from omni_trio.comm.tensor_walk import extract_tensors, restore
from tests.comm.helpers import copy_out

REPO = Path(__file__).resolve().parents[2]


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def _fill_bytes(data: bytes) -> Callable[[memoryview], None]:
    def fill(view: memoryview) -> None:
        view[: len(data)] = data

    return fill


async def test_round_trip_4mb_tensor_in_process(shm_prefix: str) -> None:
    with trio.fail_after(10):
        audio = torch.randn(1024 * 1024)  # 4 MiB float32
        payload = {"audio": audio, "meta": {"sr": 16000}}
        header, tensors = extract_tensors(payload)
        total, entries = pack_tensors(tensors)
        assert total >= OFF_THREAD_BYTES  # exercises the worker-thread path
        async with ShmRelay(shm_prefix) as relay:
            put = await relay.put("enc", total, lambda view: write_packed(view, tensors, entries))
            assert put.size == total and put.info() == {"shm_name": put.name, "size": total}
            assert put.name.startswith(shm_prefix + "-") and _exists(put.name)
            assert relay.in_use() == 1 and relay.in_use("enc") == 1
            assert os.stat(os.path.join(SHM_DIR, put.name)).st_mode & 0o777 == 0o600

            buffer = await read_segment(put.name, put.size, copy_out, prefix=shm_prefix)
            assert not _exists(put.name)  # the receiver owns deletion
            back = restore(header, unpack_tensors(buffer, entries))
            assert isinstance(back, dict)
            assert torch.equal(back["audio"], audio) and back["meta"] == {"sr": 16000}

            relay.settle(put, True)
            assert relay.in_use() == 0


async def test_round_trip_between_two_processes(shm_prefix: str) -> None:
    with trio.fail_after(10):
        tensor = torch.randn(1024 * 1024)  # 4 MiB
        _, tensors = extract_tensors({"x": tensor})
        total, entries = pack_tensors(tensors)
        relay = ShmRelay(shm_prefix)
        put = await relay.put("reader", total, lambda view: write_packed(view, tensors, entries))
        # The reader is another OS process using the receiver API; it
        # reports a digest of what it read (hashing needs no torch there).
        reader = textwrap.dedent(
            """
            import hashlib, sys, trio
            from omni_trio.comm.oneshot import read_segment
            name, size = sys.argv[1], int(sys.argv[2])
            digest = trio.run(read_segment, name, size, lambda v: hashlib.sha256(v).hexdigest())
            print(digest)
            """
        )
        result = await trio.run_process(
            [sys.executable, "-c", reader, put.name, str(put.size)],
            capture_stdout=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        sent = bytearray(total)
        write_packed(memoryview(sent), tensors, entries)
        assert result.stdout.decode().strip() == hashlib.sha256(sent).hexdigest()
        assert not _exists(put.name)  # unlinked by the reader process
        relay.settle(put, True)
        await relay.aclose()


async def test_credits_are_per_target(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, credits_per_target=2)
        a1 = await relay.put("A", 10, _fill_bytes(b"a1"))
        a2 = await relay.put("A", 10, _fill_bytes(b"a2"))
        third: list[ShmPut] = []

        async def put_third() -> None:
            third.append(await relay.put("A", 10, _fill_bytes(b"a3")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(put_third)
            await trio.testing.wait_all_tasks_blocked()
            assert third == []  # A is out of credits...
            b1 = await relay.put("B", 10, _fill_bytes(b"b1"))  # ...B is not
            b2 = await relay.put("B", 10, _fill_bytes(b"b2"))
            assert relay.in_use("B") == 2 and third == []
            relay.settle(a1, True)  # one of A's ACKs arrives
        assert len(third) == 1 and relay.in_use("A") == 2
        for put in (a2, third[0], b1, b2):
            relay.settle(put, False)
        assert relay.in_use() == 0


async def test_settle_failure_unlinks_and_is_idempotent(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, credits_per_target=1)
        put = await relay.put("t", 100, _fill_bytes(b"x" * 100))
        assert _exists(put.name)
        relay.settle(put, False)  # e.g. ACK timeout: the receiver never read it
        assert not _exists(put.name) and relay.in_use() == 0
        relay.settle(put, False)
        relay.settle(put, True)
        # exactly one credit came back: a second put succeeds, a third would wait
        again = await relay.put("t", 1, _fill_bytes(b"y"))
        with trio.move_on_after(0.05) as scope:
            await relay.put("t", 1, _fill_bytes(b"z"))
        assert scope.cancelled_caught
        relay.settle(again, True)
        await relay.aclose()


async def test_transfer_too_large(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, max_transfer_bytes=1000)
        with pytest.raises(TransferTooLarge) as info:
            await relay.put("t", 1001, _fill_bytes(b""))
        assert "1000" in str(info.value) and "1001" in str(info.value)
        assert isinstance(info.value, ValueError)
        assert relay.in_use() == 0
        ok = await relay.put("t", 1000, _fill_bytes(b"x"))
        relay.settle(ok, True)


async def test_failing_fill_removes_segment_and_returns_credit(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, credits_per_target=1)

        def boom(view: memoryview) -> None:
            raise RuntimeError("copy failed")

        for size in (10, 2 * OFF_THREAD_BYTES):  # inline and worker-thread paths
            with pytest.raises(RuntimeError, match="copy failed"):
                await relay.put("t", size, boom)
            assert relay.in_use() == 0
        put = await relay.put("t", 1, _fill_bytes(b"k"))  # the credit is back
        relay.settle(put, True)


async def test_fill_that_keeps_a_view_fails_cleanly(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix)
        kept: list[torch.Tensor] = []
        with pytest.raises(BufferError, match="outlived"):
            await relay.put("t", 16, lambda view: kept.append(torch.frombuffer(view, dtype=torch.uint8)))
        kept.clear()
        assert relay.in_use() == 0


async def test_zero_byte_transfer_gets_one_byte(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix)
        put = await relay.put("t", 0, lambda view: None)
        assert put.size == 1
        assert await read_segment(put.name, 1, bytes) == b"\x00"
        relay.settle(put, True)


async def test_cancelled_put_waiting_for_credit_leaves_nothing(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, credits_per_target=1)
        put = await relay.put("t", 8, _fill_bytes(b"12345678"))
        with trio.move_on_after(0.01):
            await relay.put("t", 8, _fill_bytes(b"x"))
        assert relay.in_use() == 1
        await relay.aclose()  # unlinks what is still outstanding
        assert not _exists(put.name) and relay.in_use() == 0
        with pytest.raises(trio.ClosedResourceError):
            await relay.put("t", 8, _fill_bytes(b"x"))


async def test_read_segment_errors(shm_prefix: str) -> None:
    with trio.fail_after(10):
        with pytest.raises(SegmentNotFound, match=f"shared-memory segment {shm_prefix}-99 not found"):
            await read_segment(f"{shm_prefix}-99", 10, bytes)
        relay = ShmRelay(shm_prefix)
        put = await relay.put("t", 10, _fill_bytes(b"0123456789"))
        with pytest.raises(SegmentNotFound, match="not found with the expected size 11"):
            await read_segment(put.name, 11, bytes)
        with pytest.raises(ValueError, match="prefix"):
            await read_segment(put.name, 10, bytes, prefix="someone-else")
        for bad in ("../etc/passwd", "a/b", "", ".hidden"):
            with pytest.raises(ValueError, match="invalid"):
                await read_segment(bad, 10, bytes)
        # consume failing: the segment is still removed (the receiver owns it)
        with pytest.raises(ZeroDivisionError):
            await read_segment(put.name, 10, lambda view: 1 // 0)
        assert not _exists(put.name)
        relay.settle(put, False)


async def test_consume_that_keeps_a_view_is_reported(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix)
        put = await relay.put("t", 16, _fill_bytes(b"z" * 16))
        kept: list[torch.Tensor] = []
        with pytest.raises(BufferError, match="outlived"):
            await read_segment(put.name, 16, lambda view: kept.append(torch.frombuffer(view, dtype=torch.uint8)))
        kept.clear()
        assert not _exists(put.name)
        relay.settle(put, False)


def test_remove_segments_cleans_leftovers(shm_prefix: str) -> None:
    names = [f"{shm_prefix}-1", f"{shm_prefix}-2-3", f"{shm_prefix}-7"]
    others = [f"{shm_prefix}9-1", f"{shm_prefix}-x", f"{shm_prefix}-"]
    for name in names + others:
        with open(os.path.join(SHM_DIR, name), "wb"):
            pass
    try:
        assert remove_segments(shm_prefix) == sorted(names)
        assert all(not _exists(n) for n in names)
        assert all(_exists(n) for n in others)
    finally:
        for name in others:
            os.unlink(os.path.join(SHM_DIR, name))
    with pytest.raises(ValueError):
        remove_segments("../x")


async def test_remove_segments_after_a_crashed_sender(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(f"{shm_prefix}-{os.getpid()}")
        puts = [await relay.put("t", 64, _fill_bytes(b"p")) for _ in range(2)]
        # the sender "dies" without settling: the supervisor cleans by run prefix
        assert sorted(remove_segments(shm_prefix)) == sorted(p.name for p in puts)
        for put in puts:
            relay.settle(put, False)  # later settles are harmless


async def test_consume_returning_a_memoryview_slice_is_reported(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix)
        put = await relay.put("t", 16, _fill_bytes(b"s" * 16))
        with pytest.raises(BufferError, match="outlived"):
            await read_segment(put.name, 16, lambda view: view[2:4])
        relay.settle(put, False)


async def test_zero_copy_read_keeps_the_mapping_while_views_live(shm_prefix: str) -> None:
    with trio.fail_after(10):
        tensors = {"t0": torch.arange(2 * OFF_THREAD_BYTES // 8, dtype=torch.float64)}
        total, entries = pack_tensors(tensors)
        relay = ShmRelay(shm_prefix)
        put = await relay.put("t", total, lambda view: write_packed(view, tensors, entries))
        raw = await read_segment(
            put.name, put.size, lambda view: torch.frombuffer(view, dtype=torch.uint8), zero_copy=True
        )
        assert not _exists(put.name)  # unlinked, yet still mapped through ``raw``
        relay.settle(put, True)
        out = unpack_tensors(raw, entries)
        del raw
        assert torch.equal(out["t0"], tensors["t0"])
