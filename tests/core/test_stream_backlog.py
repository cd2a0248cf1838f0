"""Stream output queued for callers that read slowly is capped (SPEC §6.5, ``stream_delivery``).

Once the events waiting for their readers weigh more than ``max_total_backlog_bytes``, whole streams
fail with ``RequestQueueFull``, those whose readers have been idle longest first, until the rest fits.
The accounting itself (:class:`~omni_trio.coordinator.stream_backlog.StreamBacklog`) is checked in memory; the
pipeline tests run real stages in the caller's process.
"""

from __future__ import annotations

import math

import pytest
import torch
import trio

import omni_trio as ot
from omni_trio.coordinator.live_request import LiveRequest
from omni_trio.coordinator.stream_backlog import StreamBacklog, event_bytes
from omni_trio.payload import OmniRequest, StagePayload
from tests.placement import stage

KB = 1024


def _stream(request_id: str) -> LiveRequest:
    live = LiveRequest(request_id, OmniRequest("x"), frozenset({"voc"}), True)
    live.events, live.received = trio.open_memory_channel[object](math.inf)
    return live


def test_an_event_weighs_its_tensors_arrays_and_bytes_one_level_deep() -> None:
    pcm = torch.zeros(256, dtype=torch.float32)
    assert event_bytes(pcm) == 1 * KB
    assert event_bytes(b"x" * 100) == 100
    assert event_bytes({"pcm": pcm, "raw": bytearray(24), "text": "hello", "n": 3}) == KB + 24
    assert event_bytes(StagePayload("r", OmniRequest("x"), {"pcm": pcm})) == KB
    assert event_bytes({"nested": {"pcm": pcm}}) == 0
    assert event_bytes("text") == event_bytes(None) == 0


def test_a_take_subtracts_and_only_what_does_not_fit_is_failed_idlest_reader_first() -> None:
    backlog = StreamBacklog(limit_bytes=120)
    old, reading, new = _stream("old"), _stream("reading"), _stream("new")
    for live in (old, reading, new):
        backlog.started(live)
    backlog.queued(old, 40)
    backlog.queued(reading, 30)
    backlog.queued(reading, 0)  # an event of no bytes is taken in its turn like any other
    backlog.taken(reading)
    assert (backlog.total, reading.backlog_bytes) == (40, 0)
    assert not backlog.queued(reading, 50)
    assert not backlog.queued(new, 20)
    assert backlog.queued(new, 20)  # over the limit now
    assert backlog.total == 130
    # "old" never read (the oldest admission): it goes first, and dropping it is enough.
    assert backlog.to_fail() == [old]
    backlog.dropped(old)
    assert (backlog.total, old.backlog_bytes, len(old.backlog_sizes)) == (90, 0, 0)
    assert backlog.to_fail() == []
    # "reading" took events after "new" was admitted: "new" is the idler of the two, and goes first.
    backlog.taken(reading)
    backlog.taken(reading)
    assert (backlog.total, reading.backlog_bytes) == (40, 0)
    backlog.queued(reading, 120)
    assert backlog.to_fail() == [new]
    backlog.queued(reading, 10)
    assert backlog.to_fail() == [new, reading]


def _streamer_config(limit_bytes: int) -> ot.PipelineConfig:
    return ot.PipelineConfig(
        stages=[stage("voc", "create_sized_streamer", terminal=True)],
        stream_delivery=ot.StreamDeliveryConfig(max_total_backlog_bytes=limit_bytes),
    )


async def test_the_idlest_stream_fails_with_queue_full_and_the_others_go_on() -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(_streamer_config(64 * KB)) as pipeline:
            # 48 KiB that nobody reads: under the limit on its own.
            async with pipeline.stream("idle", "x", params={"chunk_numels": [4 * KB] * 3}) as idle:
                # The stage serves requests in turn: once this one is done, all of "idle" is queued.
                await pipeline.submit("barrier", "x", params={"chunk_numels": []})
                assert (await pipeline.stats()).stream_backlog_bytes == 48 * KB
                # A 32 KiB result for a reader that waits for it: 80 KiB queued, over the limit.
                async with pipeline.stream("active", "x", params={"result_numel": 8 * KB}) as active:
                    events = [event async for event in active]
                assert events[-1].result["n"] == 8 * KB
                with pytest.raises(ot.RequestQueueFull, match=r"max_total_backlog_bytes \(65536\)") as failed:
                    async for _ in idle:
                        pass  # its chunks were dropped: the failure is all that is left
                assert "49152 bytes" in str(failed.value)
            # The dropped bytes no longer count: a stream as big as "idle" gets through.
            async with pipeline.stream("again", "x", params={"chunk_numels": [4 * KB] * 3}) as again:
                chunks = [event async for event in again if isinstance(event, ot.StreamMessage)]
            assert [chunk.chunk.numel() for chunk in chunks] == [4 * KB] * 3
            assert (await pipeline.stats()).stream_backlog_bytes == 0


def test_the_limit_is_validated() -> None:
    with pytest.raises(ot.ConfigError, match=r"stream_delivery.max_total_backlog_bytes: expected a whole number"):
        _streamer_config(0)
