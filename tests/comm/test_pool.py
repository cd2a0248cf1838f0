"""The pooled fast path: slot reuse, slot release after the receiver's views die, the
one-shot fallback, cleanup at close, and (in processes) no reuse while a tensor is held."""

from __future__ import annotations

import gc
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import trio

import omni_trio as ot
from omni_trio.comm.dataref import DataRef, DataRefKind
from omni_trio.comm.oneshot import read_segment
from omni_trio.comm.segments import SHM_DIR, SegmentNotFound, is_pooled_slot, remove_segments
from omni_trio.comm.shm import ShmPut, ShmRelay
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.comm.slotpool import MIN_SLOT_BYTES, slot_size
from omni_trio.comm.transfer import decode_object, encode_object
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import MalformedMessage, decode, encode
from tests.process import helpers
from tests.process.conftest import ipc_base

__all__ = ["ipc_base"]  # every test here also checks that nothing is left behind

POOL = 4 * MIN_SLOT_BYTES  # room for two slots of the largest pooled class


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(SHM_DIR, name))


def _fill(byte: int) -> Callable[[memoryview], None]:
    def fill(view: memoryview) -> None:
        view[:] = bytes([byte]) * view.nbytes

    return fill


async def _transfer(relay: ShmRelay, target: str, obj: object, n: int) -> tuple[DataRef, ShmPut]:
    ref, put = await encode_object(
        obj, relay=relay, sender="a", target=target, object_id=f"o{n}", kind=DataRefKind.stage_payload
    )
    assert put is not None
    return ref, put


def test_slot_sizes() -> None:
    assert slot_size(0) == slot_size(1) == slot_size(MIN_SLOT_BYTES) == MIN_SLOT_BYTES
    assert slot_size(MIN_SLOT_BYTES + 1) == 2 * MIN_SLOT_BYTES
    assert slot_size(64 << 20) == 64 << 20 and slot_size((64 << 20) + 1) == 128 << 20


async def test_pool_reuses_a_slot_once_acked_and_released(shm_prefix: str) -> None:
    with trio.fail_after(10):
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            first = await relay.put("b", 100, _fill(1))
            assert first.pooled and first.segment_size == MIN_SLOT_BYTES and first.size == 100
            assert first.info() == {"shm_name": first.name, "size": 100, "segment_size": MIN_SLOT_BYTES,
                                    "lease": first.lease}
            assert is_pooled_slot(first.name) and first.name.startswith(shm_prefix + "-")
            assert relay.pool_stats() == {"slots": 1, "free": 0, "lent": 1, "bytes": MIN_SLOT_BYTES}

            relay.settle(first, True)  # read OK: the credit is back, the slot is still lent
            assert relay.in_use() == 0 and relay.pool_stats()["lent"] == 1
            second = await relay.put("b", 100, _fill(2))
            assert second.name != first.name  # not reused while the receiver may view it

            assert relay.release(first.name, first.lease, "b")  # now it is
            assert relay.pool_stats()["free"] == 1
            third = await relay.put("b", 200, _fill(3))
            assert third.name == first.name and third.lease != first.lease
            assert relay.pool_stats() == {"slots": 2, "free": 0, "lent": 2, "bytes": 2 * MIN_SLOT_BYTES}

            # A release may arrive before the ACK: the slot waits for the ACK.
            assert relay.release(third.name, third.lease, "b")
            assert relay.pool_stats()["free"] == 0
            relay.settle(third, True)
            assert relay.pool_stats()["free"] == 1
            relay.settle(second, True)
            relay.release(second.name, second.lease, "b")
            assert relay.pool_stats() == {"slots": 2, "free": 2, "lent": 0, "bytes": 2 * MIN_SLOT_BYTES}


async def test_bad_releases_are_ignored(shm_prefix: str) -> None:
    with trio.fail_after(10):
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            put = await relay.put("b", 10, _fill(1))
            assert put.lease is not None
            relay.settle(put, True)
            assert not relay.release(put.name, put.lease + 1, "b")  # another lease
            assert not relay.release(put.name, put.lease, "c")  # another receiver
            assert not relay.release(f"{shm_prefix}-p99", put.lease, "b")  # unknown slot
            assert relay.pool_stats()["lent"] == 1
            assert relay.release(put.name, put.lease, "b")
            assert not relay.release(put.name, put.lease, "b")  # repeated
            again = await relay.put("b", 10, _fill(2))
            assert again.name == put.name
            assert not relay.release(put.name, put.lease, "b")  # a stale lease never frees a reused slot
            assert relay.pool_stats()["lent"] == 1
            relay.settle(put, False)  # a stale settle of the old put is ignored too
            assert _exists(again.name) and relay.in_use() == 1


async def test_failed_ack_retires_the_slot(shm_prefix: str) -> None:
    with trio.fail_after(10):
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            put = await relay.put("b", 10, _fill(1))
            assert put.lease is not None
            relay.settle(put, False)  # failed read, ACK timeout or abort: the receiver may hold views
            assert not _exists(put.name) and relay.pool_stats() == {"slots": 0, "free": 0, "lent": 0, "bytes": 0}
            assert not relay.release(put.name, put.lease, "b")  # a late release is harmless
            # But a slot released before its failure ACK is safe to reuse.
            put = await relay.put("b", 10, _fill(2))
            assert put.lease is not None
            relay.release(put.name, put.lease, "b")
            relay.settle(put, False)
            assert _exists(put.name) and relay.pool_stats()["free"] == 1


async def test_one_shot_fallback(shm_prefix: str) -> None:
    with trio.fail_after(10):
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            # Bigger than half the pool: one-shot, read and unlinked by the receiver as before.
            big = await relay.put("b", 2 * MIN_SLOT_BYTES + 1, _fill(7))
            assert not big.pooled and not is_pooled_slot(big.name) and big.info() == {
                "shm_name": big.name, "size": 2 * MIN_SLOT_BYTES + 1}
            assert await read_segment(big.name, big.size, lambda v: bytes(v[:2])) == b"\x07\x07"
            assert not _exists(big.name)
            relay.settle(big, True)

            # The pool lent out: two slots of the largest class fill it; the third put falls back.
            a = await relay.put("b", 2 * MIN_SLOT_BYTES, _fill(1))
            b = await relay.put("c", 2 * MIN_SLOT_BYTES, _fill(2))
            c = await relay.put("d", 10, _fill(3))
            assert a.pooled and b.pooled and not c.pooled
            relay.settle(c, False)
            assert not _exists(c.name)
            for put in (a, b):
                relay.settle(put, True)
                assert put.lease is not None
                relay.release(put.name, put.lease, "b" if put is a else "c")
            # Free slots of another size are evicted (unlinked) to make room.
            small = await relay.put("b", 10, _fill(4))
            assert small.pooled and small.segment_size == MIN_SLOT_BYTES
            assert sum(not _exists(p.name) for p in (a, b)) == 1
            relay.settle(small, True)

        async with ShmRelay(shm_prefix) as relay:  # pooling off (the relay's default)
            put = await relay.put("b", 10, _fill(1))
            assert not put.pooled
            relay.settle(put, False)


async def test_close_unlinks_every_slot_free_lent_or_unsettled(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(shm_prefix, pool_bytes=POOL)
        lent = await relay.put("b", 10, _fill(2))  # ACKed, still viewed by the receiver
        free = await relay.put("b", 10, _fill(1))
        assert free.lease is not None
        relay.settle(free, True)
        relay.release(free.name, free.lease, "b")
        relay.settle(lent, True)
        unsettled = await relay.put("b", MIN_SLOT_BYTES + 1, _fill(3))  # no ACK yet
        names = relay.slot_names()
        assert len(names) == 3 and all(_exists(n) for n in names)
        await relay.aclose()
        assert not any(_exists(n) for n in names) and relay.in_use() == 0
        assert relay.pool_stats()["slots"] == 0
        relay.settle(unsettled, True)  # late ACKs and releases after the close are harmless
        assert lent.lease is not None and not relay.release(lent.name, lent.lease, "b")
        with pytest.raises(trio.ClosedResourceError):
            await relay.put("b", 10, _fill(4))


async def test_remove_segments_removes_pooled_slots(shm_prefix: str) -> None:
    with trio.fail_after(10):
        relay = ShmRelay(f"{shm_prefix}-3", pool_bytes=POOL)
        put = await relay.put("b", 10, _fill(1))
        assert remove_segments(shm_prefix) == [put.name]  # what a supervisor does after a crash
        await relay.aclose()


async def test_zero_copy_receive_and_release_from_another_thread(shm_prefix: str) -> None:
    """The receiver's tensors view the slot; dropping the last one on another thread returns it."""
    with trio.fail_after(10):
        token = trio.lowlevel.current_trio_token()
        cache = SegmentCache()
        async with ShmRelay(shm_prefix, pool_bytes=8 << 20) as relay:
            released: list[tuple[str, int]] = []
            arrived = trio.Event()

            def on_release_for(ref: DataRef) -> Callable[[], None]:
                assert ref.buffer is not None and ref.buffer.pooled
                name, lease = ref.buffer.info["shm_name"], ref.buffer.info["lease"]

                def back_on_the_loop() -> None:
                    released.append((name, lease))
                    relay.release(name, lease, "b")
                    arrived.set()

                return lambda: token.run_sync_soon(back_on_the_loop)

            source = {"x": torch.arange(300_000, dtype=torch.float32), "y": torch.ones(3, 5), "tag": "hi"}
            ref, put = await _transfer(relay, "b", source, 0)
            got = await decode_object(ref, shm_prefix=shm_prefix, segments=cache, on_release=on_release_for(ref))
            relay.settle(put, True)  # the receiver ACKs right after reading
            assert got["tag"] == "hi" and torch.equal(got["x"], source["x"]) and torch.equal(got["y"], source["y"])
            assert put.name in cache and released == []
            # A view, not a copy: writing through the slot's mapping shows in the tensor.
            alias = await cache.view(put.name, put.segment_size or 0, put.size)
            alias[4:8] = 0  # the bytes of x[1]
            assert got["x"][1] == 0.0
            del alias
            assert released == []  # ``got`` still views the slot
            gc.collect()
            assert released == []

            # The receiving stage drops its tensors in its scheduler thread.
            holder = [got]
            del got

            def drop() -> None:
                holder.clear()

            await trio.to_thread.run_sync(drop)
            await arrived.wait()
            assert released == [(put.name, put.lease)]
            assert relay.pool_stats() == {"slots": 1, "free": 1, "lent": 0, "bytes": slot_size(put.size)}

            # The next transfer reuses the slot and the receiver's cached mapping.
            arrived = trio.Event()
            ref2, put2 = await _transfer(relay, "b", {"x": torch.full((300_000,), 7.0)}, 1)
            assert put2.name == put.name and put2.lease != put.lease
            got2 = await decode_object(ref2, shm_prefix=shm_prefix, segments=cache, on_release=on_release_for(ref2))
            relay.settle(put2, True)
            assert bool((got2["x"] == 7.0).all()) and len(cache) == 1
            got2["x"].add_(1)  # a receiver may write into what it received
            del got2
            await arrived.wait()
            assert released[-1] == (put2.name, put2.lease)
        cache.clear()


async def test_failed_pooled_read_forgets_the_mapping(shm_prefix: str) -> None:
    with trio.fail_after(10):
        cache = SegmentCache()
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            ref, put = await _transfer(relay, "b", {"x": torch.ones(20_000)}, 0)
            bad = DataRef(
                kind=ref.kind, object_id=ref.object_id, transport=ref.transport, layout=ref.layout,
                buffer=ref.buffer, header=b"not a pickle", tensors=ref.tensors,
            )
            calls: list[int] = []
            with pytest.raises(pickle.UnpicklingError):
                await decode_object(bad, segments=cache, on_release=lambda: calls.append(1))
            assert put.name not in cache
            relay.settle(put, False)  # the receiver's failure ACK retires the slot
            assert not _exists(put.name)
            gc.collect()
            assert len(calls) <= 1  # a release for a retired slot may come; it is ignored


async def test_decode_without_a_cache_copies_and_releases_at_once(shm_prefix: str) -> None:
    with trio.fail_after(10):
        async with ShmRelay(shm_prefix, pool_bytes=POOL) as relay:
            ref, put = await _transfer(relay, "b", {"x": torch.arange(10_000)}, 0)
            calls: list[int] = []
            got = await decode_object(ref, on_release=lambda: calls.append(1))
            assert calls == [1] and torch.equal(got["x"], torch.arange(10_000))
            relay.settle(put, True)
            assert put.lease is not None and relay.release(put.name, put.lease, "b")


async def test_segment_cache_checks_identity_and_bounds_itself(shm_prefix: str) -> None:
    with trio.fail_after(10):
        cache = SegmentCache(max_bytes=2 * MIN_SLOT_BYTES)
        async with ShmRelay(shm_prefix, pool_bytes=8 * MIN_SLOT_BYTES) as relay:
            puts = [await relay.put(t, 10, _fill(i)) for i, t in enumerate("bcd")]
            views = [await cache.view(p.name, MIN_SLOT_BYTES, 10, prefix=shm_prefix) for p in puts]
            assert [int(v[0]) for v in views] == [0, 1, 2]
            assert len(cache) == 2 and cache.nbytes == 2 * MIN_SLOT_BYTES and puts[0].name not in cache
            assert int(views[0][0]) == 0  # evicted, still mapped while viewed
            # A new file under a cached name (a restarted sender) is mapped afresh.
            path = os.path.join(SHM_DIR, puts[2].name)
            os.unlink(path)
            with open(path, "wb") as f:
                f.write(b"\x09" * MIN_SLOT_BYTES)
            assert int((await cache.view(puts[2].name, MIN_SLOT_BYTES, 10))[0]) == 9
            assert int(views[2][0]) == 2
            with pytest.raises(SegmentNotFound):
                await cache.view(f"{shm_prefix}-p77", MIN_SLOT_BYTES, 10)
            with pytest.raises(SegmentNotFound, match="expected size"):
                await cache.view(puts[1].name, 2 * MIN_SLOT_BYTES, 10)
            with pytest.raises(ValueError, match="prefix"):
                await cache.view(puts[1].name, MIN_SLOT_BYTES, 10, prefix="someone-else")
            with pytest.raises(ValueError, match="exceeds"):
                await cache.view(puts[1].name, MIN_SLOT_BYTES, MIN_SLOT_BYTES + 1)
            for put in puts:
                relay.settle(put, False)
            # The relay retired the slots it created; the file planted at puts[2]'s name is not its to remove.
            assert os.path.exists(path) and not os.path.exists(os.path.join(SHM_DIR, puts[1].name))
            os.unlink(path)
        del views
        cache.clear()


def test_slot_release_message_is_validated() -> None:
    msg = m.SlotRelease(from_stage="b", to_stage="a", shm_name="omnitrio-x-1-0-p3", lease=5)
    assert decode(encode(msg)) == msg
    for bad in (-1, True, 1.5, "5"):
        with pytest.raises((TypeError, ValueError)):
            m.SlotRelease(from_stage="b", to_stage="a", shm_name="n", lease=bad)  # type: ignore[arg-type]
    import msgpack

    for fields in (
        {"from_stage": "b", "to_stage": "a", "shm_name": "n", "lease": -1},
        {"from_stage": "b", "to_stage": "a", "shm_name": "n", "lease": True},
        {"from_stage": "b", "to_stage": "a", "shm_name": "", "lease": 1},
        {"from_stage": "b", "to_stage": "a", "shm_name": "n"},
        {"from_stage": "b", "to_stage": "a", "shm_name": "n", "lease": 1, "extra": 1},
    ):
        with pytest.raises(MalformedMessage):
            decode([b"slot_release", msgpack.packb(fields)])


def test_pooled_buffer_info_is_validated() -> None:
    base = {"_type": "DataRef", "version": 1, "kind": "stage_payload", "object_id": "o", "transport": "shm",
            "layout": "packed_tensors", "header": b"h"}
    good = {"shm_name": "n", "size": 10, "segment_size": 64, "lease": 0}
    assert DataRef.from_wire({**base, "buffer": {"transport": "shm", "info": good, "length": 10}}).buffer.pooled
    for info in (
        {**good, "segment_size": 9},  # smaller than the transfer
        {**good, "lease": -1},
        {**good, "lease": True},
        {"shm_name": "n", "size": 10, "lease": 0},  # one without the other
        {"shm_name": "n", "size": 10, "segment_size": 64},
    ):
        with pytest.raises(MalformedMessage):
            DataRef.from_wire({**base, "buffer": {"transport": "shm", "info": info, "length": 10}})


def _pipeline(base: Path, **comm: int) -> ot.PipelineConfig:
    return helpers.config(
        base,
        ot.StageConfig(name="src", factory_path="tests.comm.pool_stages.create_filled_tensor", process="p_src",
                       next="sink", comm=ot.CommConfig(**comm) if comm else None),
        ot.StageConfig(name="sink", factory_path="tests.comm.pool_stages.create_holding_sink", process="p_sink",
                       terminal=True),
    )


async def test_held_tensor_stays_valid_while_later_transfers_reuse_the_pool(ipc_base: Path) -> None:
    numel = 65_536  # 256 KiB of float32: shared memory, a pooled slot
    with trio.fail_after(60):
        async with ot.open_pipeline(_pipeline(ipc_base, pool_mb=1)) as pipeline:
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))
            held = await pipeline.submit("hold", "x", params={"numel": numel, "fill": 1.0, "hold": True})
            # Zero copy: the sink's tensor lives in a pooled slot of the source's relay.
            assert os.path.basename(held["mapped"]).startswith(prefix) and is_pooled_slot(held["mapped"]), held
            assert (held["first"], held["last"], held["held_sum"]) == (1.0, 1.0, float(numel))
            for i in range(2, 8):
                out = await pipeline.submit(f"r{i}", "x", params={"numel": numel, "fill": float(i)})
                assert (out["first"], out["last"]) == (float(i), float(i)), out
                # The held tensor's slot was never written again.
                assert out["held_sum"] == float(numel), out
                assert out["mapped"] != held["mapped"], out
            # 256 KiB slots in a 1 MiB pool: at most 4. With one held, the other
            # transfers took turns in the rest of the pool.
            slots = {s for s in helpers.shm_segments() if s.startswith(f"{prefix}-") and is_pooled_slot(s)}
            assert 2 <= len(slots) <= 4, slots
            # Releasing the held tensor lets its slot serve again.
            dropped = await pipeline.submit("drop", "x", params={"numel": numel, "fill": 9.0, "drop": True})
            assert dropped["held_sum"] is None
            seen = set()
            for i in range(10):
                out = await pipeline.submit(f"s{i}", "x", params={"numel": numel, "fill": 3.0})
                assert (out["first"], out["last"]) == (3.0, 3.0)
                seen.add(out["mapped"])
            assert seen <= {f"/dev/shm/{s}" for s in slots} | {held["mapped"]}, (seen, slots)
            assert (await pipeline.stats()).idle


async def test_transfers_beyond_the_pool_use_one_shot_segments(ipc_base: Path) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(_pipeline(ipc_base, pool_mb=1)) as pipeline:
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))
            numel = 262_144  # 1 MiB: more than half of the pool
            for i in range(3):
                out = await pipeline.submit(f"big{i}", "x", params={"numel": numel, "fill": float(i)})
                assert (out["first"], out["last"]) == (float(i), float(i))
                assert not out["mapped"].startswith(SHM_DIR), out  # copied out into the receiver's memory
            assert not [s for s in helpers.shm_segments() if s.startswith(f"{prefix}-")]

