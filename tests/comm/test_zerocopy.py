"""``ot.empty``: outputs built in the sender's slot pool cross processes by reference.

In one process (a real relay, real /dev/shm, real threads): the tensor lies in a held slot, a send
lends that slot (no copy, no new slot), views go by offset, a second send of a lent slot copies, the
slot goes back to the pool only once both the receiver and the sender are done with it, and a full
pool falls back to a plain allocation, traced. In processes: the receiver maps the very slot the
sender wrote, slots are reused request after request, a tensor kept after sending stays intact, an
unsent tensor's slot comes back when it is garbage-collected, and embedded stages get torch.empty.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

import omni_trio as ot
from examples.zero_copy_stages import mapped_file
from omni_trio.comm.alloc import SlotAllocator, allocating
from omni_trio.comm.dataref import DataRefKind
from omni_trio.comm.segments import SHM_DIR, is_pooled_slot
from omni_trio.comm.shm import ShmRelay
from omni_trio.comm.slotcache import SegmentCache
from omni_trio.comm.transfer import decode_object, encode_object
from omni_trio.tracing.trace import Tracer
from tests.process import helpers
from tests.process.conftest import ipc_base

__all__ = ["ipc_base"]  # every process test here also checks that nothing is left behind

NUMEL = 262_144  # 1 MiB of float32: a 1 MiB slot


def _events(path: Path, name: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [e for e in map(json.loads, handle) if e["event"] == name]


async def _in_thread(allocator: SlotAllocator, fn: Any, *args: Any) -> Any:
    """Run ``fn`` on a thread where ``ot.empty`` uses ``allocator``, as a scheduler thread does."""

    def body() -> Any:
        with allocating(allocator):
            return fn(*args)

    return await trio.to_thread.run_sync(body)


def _filled(value: float, numel: int = NUMEL) -> torch.Tensor:
    t = ot.empty(numel, dtype=torch.float32)
    t.fill_(value)
    return t


async def test_a_lent_slot_is_sent_by_reference_and_comes_back_when_both_sides_are_done(
    shm_prefix: str, tmp_path: Path
) -> None:
    with trio.fail_after(20):
        tracer = Tracer(tmp_path / "trace.jsonl", "main")
        cache = SegmentCache()
        async with ShmRelay(shm_prefix, pool_bytes=4 << 20) as relay:
            allocator = SlotAllocator(lambda: relay, stage="a", tracer=tracer)
            t = await _in_thread(allocator, _filled, 2.5)
            # The tensor is the slot: its memory is mapped from a pooled segment of the relay.
            slot = os.path.basename(mapped_file(t.data_ptr()))
            assert is_pooled_slot(slot) and slot in relay.slot_names()
            assert relay.pool_stats() == {"slots": 1, "free": 0, "lent": 1, "bytes": 4 * NUMEL}

            obj = {"audio": t, "rate": 24_000}
            ref, put = await encode_object(obj, relay=relay, sender="a", target="b", object_id="o1",
                                           kind=DataRefKind.stage_payload, allocator=allocator)
            # Lent, not filled: the same slot, no second one, the tensor at offset 0.
            assert put is not None and put.name == slot and put.size == 4 * NUMEL
            assert relay.pool_stats()["slots"] == 1 and ref.tensors[0].offset == 0
            assert allocator.sent_by_reference == 1
            releases: list[int] = []
            got = await decode_object(ref, shm_prefix=shm_prefix, segments=cache,
                                      on_release=lambda: releases.append(1))
            relay.settle(put, True)
            assert got["rate"] == 24_000 and torch.equal(got["audio"], t)
            assert os.path.basename(mapped_file(got["audio"].data_ptr())) == slot

            # The receiver is done, the sender still holds the tensor: the slot stays out of the pool.
            del got
            assert releases == [1]
            relay.release(put.name, put.lease or 0, "b")
            assert relay.pool_stats()["free"] == 0
            assert float(t[-1]) == 2.5  # still valid, never reused under it

            # The sender drops it (on its thread): back to the pool, and the next ot.empty reuses it.
            holder = [t, obj]
            del t, obj
            await trio.to_thread.run_sync(holder.clear)
            await trio.testing.wait_all_tasks_blocked()
            assert relay.pool_stats()["free"] == 1
            again = await _in_thread(allocator, _filled, 1.0)
            assert os.path.basename(mapped_file(again.data_ptr())) == slot
            del again
            gc.collect()
            await trio.testing.wait_all_tasks_blocked()
            assert relay.pool_stats()["free"] == 1
        cache.clear()
        tracer.close()
    sends = _events(tmp_path / "trace.jsonl", "zero_copy_send")
    assert [(e["stage"], e["to_stage"], e["shm_name"], e["bytes"]) for e in sends] == [("a", "b", slot, 4 * NUMEL)]
    assert not _events(tmp_path / "trace.jsonl", "zero_copy_fallback")


async def test_views_go_by_offset_and_a_second_send_of_a_lent_slot_copies(shm_prefix: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        cache = SegmentCache()
        tracer = Tracer(tmp_path / "trace.jsonl", "main")
        async with ShmRelay(shm_prefix, pool_bytes=8 << 20) as relay:
            allocator = SlotAllocator(lambda: relay, stage="a", tracer=tracer)
            t = await _in_thread(allocator, lambda: torch.arange(NUMEL, dtype=torch.float32, out=ot.empty(NUMEL)))
            slot = os.path.basename(mapped_file(t.data_ptr()))
            head, tail = t[:1000], t[5000:9000].view(40, 100)
            ref, put = await encode_object({"head": head, "tail": tail}, relay=relay, sender="a", target="b",
                                           object_id="o1", kind=DataRefKind.stage_payload, allocator=allocator)
            assert put is not None and put.name == slot
            assert [e.offset for e in ref.tensors] == [0, 5000 * 4] and put.size == 9000 * 4
            got = await decode_object(ref, shm_prefix=shm_prefix, segments=cache)
            assert torch.equal(got["head"], head) and torch.equal(got["tail"], tail)

            # Sent again while the first receiver may still view the slot: copied into another slot.
            ref2, put2 = await encode_object({"t": t}, relay=relay, sender="a", target="c", object_id="o2",
                                             kind=DataRefKind.stage_payload, allocator=allocator)
            assert put2 is not None and put2.name != slot and allocator.sent_by_reference == 1
            got2 = await decode_object(ref2, shm_prefix=shm_prefix, segments=cache)
            assert torch.equal(got2["t"], t)
            # A few small tensors from elsewhere ride in the header; the slot is still lent as it is.
            relay.settle(put, True)
            relay.release(put.name, put.lease or 0, "b")
            del got
            small = {"t": t[:5000], "lengths": torch.tensor([5000, 7]), "mask": torch.ones(3, dtype=torch.bool)}
            ref4, put4 = await encode_object(small, relay=relay, sender="a", target="b", object_id="o4",
                                             kind=DataRefKind.stage_payload, allocator=allocator)
            assert put4 is not None and put4.name == slot and len(ref4.tensors) == 1
            got4 = await decode_object(ref4, shm_prefix=shm_prefix, segments=cache)
            assert all(torch.equal(got4[k], v) for k, v in small.items())
            assert os.path.basename(mapped_file(got4["t"].data_ptr())) == slot
            relay.settle(put4, True)
            # Not contiguous, with more than 16 KiB of other tensors (counted by storage), or views of
            # two ot.empty tensors: copied.
            other = await _in_thread(allocator, _filled, 1.0)
            for obj in ({"t": t[::2]}, {"t": t, "big": torch.ones(10_000)}, {"t": t, "view": torch.ones(10_000)[:2]},
                        {"t": t, "u": other}):
                _, put3 = await encode_object(obj, relay=relay, sender="a", target="d", object_id="o3",
                                              kind=DataRefKind.stage_payload, allocator=allocator)
                assert put3 is not None and put3.name != slot
                relay.settle(put3, False)
            relay.settle(put2, True)
            del got2, got4, other
        cache.clear()
        tracer.close()
    reasons = [e["reason"] for e in _events(tmp_path / "trace.jsonl", "zero_copy_fallback")]
    assert [r.split()[-1] for r in reasons] == ["still", "contiguous", "tensor", "tensor", "tensors"], reasons
    assert "16 KiB" in reasons[2] and "16 KiB" in reasons[3] and "two" in reasons[4]

async def test_a_full_pool_falls_back_to_a_plain_allocation_traced(shm_prefix: str, tmp_path: Path) -> None:
    with trio.fail_after(20):
        tracer = Tracer(tmp_path / "trace.jsonl", "main")
        async with ShmRelay(shm_prefix, pool_bytes=2 << 20) as relay:  # two 1 MiB slots at most
            allocator = SlotAllocator(lambda: relay, stage="a", tracer=tracer)
            held = [await _in_thread(allocator, _filled, 1.0) for _ in range(2)]
            second = await _in_thread(allocator, _filled, 2.0)
            assert all(is_pooled_slot(os.path.basename(mapped_file(t.data_ptr()))) for t in held)
            assert not mapped_file(second.data_ptr()).startswith(SHM_DIR)  # ordinary memory
            assert float(second.sum()) == 2.0 * NUMEL
            # Small tensors never take a slot (they travel inline), and no allocator means torch.empty.
            small = await _in_thread(allocator, ot.empty, 16)
            assert not mapped_file(small.data_ptr()).startswith(SHM_DIR)
            assert not mapped_file(ot.empty(NUMEL).data_ptr()).startswith(SHM_DIR)
            # On the event loop itself (inline compute) it never waits for a slot.
            with allocating(allocator):
                on_loop = ot.empty(NUMEL)
            assert not mapped_file(on_loop.data_ptr()).startswith(SHM_DIR)
            assert relay.pool_stats()["slots"] == 2
            del held, second, small, on_loop
        tracer.close()
    full, loop = _events(tmp_path / "trace.jsonl", "zero_copy_fallback")
    assert full["stage"] == "a" and full["bytes"] == 4 * NUMEL and "pool" in full["reason"]
    assert "event loop" in loop["reason"]


async def test_lends_take_credits_of_their_target(shm_prefix: str) -> None:
    """Back-pressure holds for lent slots: with one credit, a second send waits for the first ACK."""
    with trio.fail_after(20):
        async with ShmRelay(shm_prefix, pool_bytes=8 << 20, credits_per_target=1) as relay:
            allocator = SlotAllocator(lambda: relay, stage="a", tracer=Tracer(None, "main"))
            tensors = [await _in_thread(allocator, _filled, float(i)) for i in range(2)]
            _, put = await encode_object({"t": tensors[0]}, relay=relay, sender="a", target="b", object_id="o1",
                                         kind=DataRefKind.stage_payload, allocator=allocator)
            sent: list[Any] = []

            async def send_second() -> None:
                sent.append(await encode_object({"t": tensors[1]}, relay=relay, sender="a", target="b",
                                                object_id="o2", kind=DataRefKind.stage_payload,
                                                allocator=allocator))

            # A send cancelled while it waits gives the slot back: it can be lent later.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_second)
                await trio.testing.wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            assert sent == [] and relay.in_use("b") == 1
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_second)
                await trio.testing.wait_all_tasks_blocked()
                assert sent == [] and relay.in_use("b") == 1  # waiting for b's only credit
                assert put is not None
                relay.settle(put, True)
            (_, put2), = sent
            assert put2 is not None and put2.name != put.name and allocator.sent_by_reference == 2
            relay.settle(put2, True)


def _pipeline(base: Path, *, embedded: bool = False, scheduler: str = "simple") -> ot.PipelineConfig:
    return helpers.config(
        base,
        ot.StageConfig(name="src", factory_path="tests.comm.zerocopy_stages.create_empty_source",
                       factory={"scheduler": scheduler}, process=None if embedded else "p_src", next="sink"),
        ot.StageConfig(name="sink", factory_path="tests.comm.zerocopy_stages.create_reporting_sink",
                       process=None if embedded else "p_sink", terminal=True),
    )


async def test_ot_empty_output_crosses_processes_without_a_copy(ipc_base: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with trio.fail_after(90):
        async with ot.open_pipeline(_pipeline(ipc_base), trace=trace) as pipeline:
            prefix = helpers.run_prefix(helpers.ipc_dir(ipc_base))
            seen: set[str] = set()
            for i in range(6):
                out = await pipeline.submit(f"r{i}", "x", params={"numel": NUMEL, "fill": float(i)})
                # The sink's tensor is mapped from the very slot the source wrote into.
                assert out["mapped"] == out["src_mapped"], out
                assert os.path.basename(out["mapped"]).startswith(prefix) and is_pooled_slot(out["mapped"])
                assert (out["numel"], out["first"], out["last"], out["sum"]) == (NUMEL, i, i, float(i) * NUMEL)
                seen.add(out["mapped"])
            # Released after use: the source took turns in a couple of slots, not a new one per request.
            assert len(seen) <= 2, seen
            # A view goes by its offset, still the same memory.
            out = await pipeline.submit("view", "x", params={"numel": NUMEL, "fill": 7.0, "offset": 1000})
            assert out["mapped"] == out["src_mapped"] and (out["numel"], out["sum"]) == (NUMEL - 1000,
                                                                                         7.0 * (NUMEL - 1000))
            assert (await pipeline.stats()).idle
    sends = [e for e in ot.read_trace(trace) if e["event"] == "zero_copy_send"]
    assert len(sends) == 7 and all(e["stage"] == "src" and e["to_stage"] == "sink" for e in sends)
    assert not [e for e in ot.read_trace(trace) if e["event"] == "zero_copy_fallback"]


async def test_kept_and_unsent_tensors_in_processes(ipc_base: Path) -> None:
    with trio.fail_after(90):
        async with ot.open_pipeline(_pipeline(ipc_base)) as pipeline:
            kept = await pipeline.submit("keep", "x", params={"numel": NUMEL, "fill": 3.0, "keep": True})
            assert kept["mapped"] == kept["src_mapped"] and kept["kept_sum"] == 3.0 * NUMEL
            for i in range(4):
                out = await pipeline.submit(f"r{i}", "x", params={"numel": NUMEL, "fill": 5.0})
                # The kept tensor's slot is never handed out again while the source holds it.
                assert out["src_mapped"] != kept["src_mapped"] and out["kept_sum"] == 3.0 * NUMEL, out
                assert out["sum"] == 5.0 * NUMEL
            # A tensor dropped without being sent gives its slot back: they take turns in the slots that
            # are free (the first may find the last sent slot not yet released by the sink), never a
            # new slot per request.
            unsent = [
                (await pipeline.submit(f"d{i}", "x", params={"numel": NUMEL, "drop_only": True}))["src_mapped"]
                for i in range(4)
            ]
            assert len(set(unsent)) <= 2 and all(is_pooled_slot(name) for name in unsent), unsent


@pytest.mark.parametrize("scheduler", ["concurrent", "threaded"])
async def test_schedulers_pass_the_pool_on_to_their_threads(ipc_base: Path, scheduler: str) -> None:
    with trio.fail_after(60):
        async with ot.open_pipeline(_pipeline(ipc_base, scheduler=scheduler)) as pipeline:
            out = await pipeline.submit("r", "x", params={"numel": NUMEL, "fill": 4.0})
    assert is_pooled_slot(out["src_mapped"]) and out["mapped"] == out["src_mapped"], out
    assert out["sum"] == 4.0 * NUMEL


async def test_embedded_stages_get_plain_tensors(ipc_base: Path) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(_pipeline(ipc_base, embedded=True)) as pipeline:
            out = await pipeline.submit("r", "x", params={"numel": NUMEL, "fill": 2.0})
    assert not out["src_mapped"].startswith(SHM_DIR) and not out["mapped"].startswith(SHM_DIR)
    assert out["sum"] == 2.0 * NUMEL
