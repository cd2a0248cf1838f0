"""Stream admission: the decision on ``MockClock`` without processes, then the refusal end to end.

The policy (:mod:`omni_trio.coordinator.stream_admission`) is fed the events the coordinator sees;
times come from trio's clock, so a ``MockClock`` with ``autojump_threshold=0`` makes them exact.
"""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

import omni_trio as ot
from omni_trio.coordinator.stream_admission import StreamAdmission
from tests.placement import build, stage

CHUNK_S = 0.08  # the playback of one chunk (80 ms of audio)


def policy(**settings: object) -> StreamAdmission:
    """A policy whose stalls count from the first late millisecond, unless the test says otherwise."""
    settings.setdefault("stall_tolerance_s", 0.0)
    return StreamAdmission(ot.StreamAdmissionConfig(**settings))  # type: ignore[arg-type]


def test_a_chunk_late_within_the_stall_tolerance_is_no_stall() -> None:
    async def main() -> None:
        admission = policy(stall_tolerance_s=0.05, recover_s=1.0)
        admission.started("r0")
        admission.declared("r0", trio.current_time(), 0.1)
        await trio.sleep(0.14)  # 40 ms after it played out: a player's buffer covers that
        admission.declared("r0", trio.current_time(), 0.1)
        assert admission.refusal(trio.current_time()) is None
        await trio.sleep(0.16)  # 60 ms late: heard
        admission.declared("r0", trio.current_time(), 0.1)
        reason = admission.refusal(trio.current_time())
        assert reason is not None and "ran dry 0.000s ago" in reason

    run(main)


async def test_session_operations_are_never_refused_by_stream_admission() -> None:
    """A session was admitted when it opened: its operations stream, but none is refused as a new stream."""
    config = build("embedded", stage("words", "create_word_session", terminal=True),
                   stream_admission=ot.StreamAdmissionConfig(mode="fixed", max_streams=1))
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:
            async with (
                pipeline.session("s1", stages=["words"]) as one,
                pipeline.session("s2", stages=["words"]) as two,
                trio.open_nursery() as nursery,  # two appends live at once, over a cap of one
            ):
                for session in (one, two, one, two):
                    nursery.start_soon(session.append, "word")
            assert (await pipeline.stats()).refused_streams == 0


def run(test: object) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_streams_that_keep_real_time_let_new_streams_in() -> None:
    async def main() -> None:
        admission = policy()
        for rid in ("declared", "paced", "texting", "silent"):
            admission.started(rid)
        for _ in range(40):
            now = trio.current_time()
            admission.declared("declared", now, CHUNK_S)  # produced a little faster than it plays
            admission.arrived("paced", now, "audio")
            admission.arrived("texting", now, "text")
            assert admission.refusal(now) is None
            await trio.sleep(0.07)
            assert admission.refusal(trio.current_time()) is None
        # The paced stream ends; the text stream pauses for a long time: text has no playback deadline.
        admission.ended("paced")
        await trio.sleep(0.05)
        admission.declared("declared", trio.current_time(), 5.0)
        await trio.sleep(1.0)
        assert admission.refusal(trio.current_time()) is None

    run(main)


def test_a_declared_stream_falling_behind_refuses_new_streams_until_it_recovers() -> None:
    async def main() -> None:
        admission = policy(recover_s=0.5)
        admission.started("r0")
        start = trio.current_time()
        admission.declared("r0", start, CHUNK_S)
        await trio.sleep(0.05)
        assert admission.refusal(trio.current_time()) is None  # 30 ms still buffered
        await trio.sleep(0.05)  # 100 ms after start: the 80 ms ran dry 20 ms ago
        reason = admission.refusal(trio.current_time())
        assert reason is not None and "'r0' has -0.020s of playback buffered" in reason
        admission.declared("r0", trio.current_time(), 10 * CHUNK_S)  # late: a stall
        await trio.sleep(0.49)
        reason = admission.refusal(trio.current_time())
        assert reason is not None and "ran dry 0.490s ago" in reason
        await trio.sleep(0.01)  # recover_s without another stall
        assert admission.refusal(trio.current_time()) is None
        admission.ended("r0")
        await trio.sleep(10)
        assert admission.refusal(trio.current_time()) is None

    run(main)


def test_the_pace_at_the_loads_seen_refuses_the_stream_that_would_take_them_past_max_pace() -> None:
    """A burst of new streams is refused before any stream underruns: the pace (wall seconds per
    playback second) measured at 4 and 8 live streams predicts it with one more."""

    async def play(admission: StreamAdmission, streams: list[str], interval: float, seconds: float) -> None:
        for _ in range(round(seconds / interval)):
            await trio.sleep(interval)
            for rid in streams:
                admission.declared(rid, trio.current_time(), CHUNK_S)
                assert admission.refusal(trio.current_time()) is None or len(streams) > 8

    async def main() -> None:
        admission = policy(stall_tolerance_s=0.05)
        streams = [f"r{n}" for n in range(4)]
        for rid in streams:
            admission.started(rid)
        await play(admission, streams, 0.04, 2.0)  # 4 live: 40 ms per 80 ms chunk, a pace of 0.5
        assert admission.refusal(trio.current_time()) is None  # one load seen: no trend yet
        streams += [f"r{n}" for n in range(4, 8)]
        for rid in streams[4:]:
            admission.started(rid)
        await play(admission, streams, 0.054, 2.16)  # 8 live: a pace of 0.675
        # The line through them: 0.5 at 4 streams, 0.04375 more per stream; 0.894 at 13, 0.9375 at 14.
        admitted = 8
        while admission.refusal(trio.current_time()) is None:
            admission.started(f"r{admitted}")
            admitted += 1
        assert admitted == 13
        reason = admission.refusal(trio.current_time())
        assert reason is not None and "with 14 streams" in reason and "max_pace=0.9" in reason
        for n in range(8, 13):
            admission.ended(f"r{n}")
        assert admission.refusal(trio.current_time()) is None  # room again once streams end

    run(main)


def test_a_stream_with_no_declared_playback_adds_nothing_to_the_pace() -> None:
    async def main() -> None:
        admission = policy()
        for n in range(40):
            admission.started(f"r{n}")
            for _ in range(30):
                admission.arrived(f"r{n}", trio.current_time(), "audio")
                await trio.sleep(0.5)  # slow, but nobody said how long its chunks play
        assert admission.refusal(trio.current_time()) is None

    run(main)


def test_min_slack_refuses_before_a_stream_runs_dry() -> None:
    async def main() -> None:
        admission = policy(min_slack_s=0.05)
        admission.started("r0")
        admission.declared("r0", trio.current_time(), 0.2)
        await trio.sleep(0.14)
        assert admission.refusal(trio.current_time()) is None
        await trio.sleep(0.02)  # 40 ms left: under min_slack_s
        assert admission.refusal(trio.current_time()) is not None
        admission.declared("r0", trio.current_time(), 0.2)  # in time: no stall, so no recover_s wait
        assert admission.refusal(trio.current_time()) is None

    run(main)


def test_an_undeclared_stream_is_timed_by_its_own_cadence() -> None:
    async def main() -> None:
        admission = policy(cadence_arrivals=4, cadence_tolerance=0.5, recover_s=1.0)
        admission.started("r0")
        # A burst of three chunks in one message, then a steady 100 ms per chunk.
        for _ in range(3):
            admission.arrived("r0", trio.current_time(), None)
        for _ in range(4):
            await trio.sleep(0.1)
            admission.arrived("r0", trio.current_time(), None)
        # The intervals per chunk: 0.1/3, 0.1, 0.1, 0.1 -> median 0.1 s; due within 0.15 s.
        await trio.sleep(0.151)
        # Its clock ran dry, but nothing came: its producer may be waiting on purpose; no refusal yet.
        assert admission.refusal(trio.current_time()) is None
        admission.arrived("r0", trio.current_time(), None)  # late: a stall seen
        reason = admission.refusal(trio.current_time())
        assert reason is not None and "'r0' ran dry 0.000s ago" in reason
        for _ in range(9):
            await trio.sleep(0.1)
            admission.arrived("r0", trio.current_time(), None)
            assert admission.refusal(trio.current_time()) is not None  # within recover_s of the stall
        await trio.sleep(0.1)
        admission.arrived("r0", trio.current_time(), None)
        assert admission.refusal(trio.current_time()) is None  # 1 s of steady pace: recovered

    run(main)


def test_a_stream_without_a_known_deadline_never_refuses() -> None:
    async def main() -> None:
        admission = policy()
        admission.started("r0")
        await trio.sleep(60)  # no chunk yet (time to first chunk is not playback)
        admission.arrived("r0", trio.current_time(), None)
        await trio.sleep(60)  # one arrival sets no cadence
        assert admission.refusal(trio.current_time()) is None

    run(main)


def test_the_fixed_cap_and_off() -> None:
    async def main() -> None:
        fixed = policy(mode="fixed", max_streams=2)
        fixed.started("a")
        assert fixed.refusal(trio.current_time()) is None
        fixed.started("b")
        reason = fixed.refusal(trio.current_time())
        assert reason is not None and "stream_admission.max_streams=2" in reason
        fixed.ended("a")
        assert fixed.refusal(trio.current_time()) is None
        off = policy(mode="off")
        off.started("a")
        off.declared("a", trio.current_time(), 0.01)
        await trio.sleep(1)
        assert off.refusal(trio.current_time()) is None

    run(main)


@pytest.mark.parametrize(
    ("settings", "path"),
    [
        ({"mode": "sometimes"}, "stream_admission.mode: expected one of 'adaptive', 'fixed', 'off'"),
        ({"mode": "fixed"}, "stream_admission.max_streams: mode 'fixed' needs a whole number >= 1"),
        ({"mode": "fixed", "max_streams": 0}, "stream_admission.max_streams: mode 'fixed' needs"),
        ({"max_streams": 4}, "stream_admission.max_streams: only mode 'fixed' uses it"),
        ({"recover_s": -1}, "stream_admission.recover_s: expected a number >= 0"),
        ({"min_slack_s": float("nan")}, "stream_admission.min_slack_s: expected a number >= 0"),
        ({"cadence_arrivals": 0}, "stream_admission.cadence_arrivals: expected a whole number >= 1"),
    ],
)
def test_bad_settings_are_named_by_their_path(settings: dict[str, object], path: str) -> None:
    with pytest.raises(ot.ConfigError, match=path):
        build("embedded", stage("s", "create_append", factory={"tag": "s"}, terminal=True),
              stream_admission=ot.StreamAdmissionConfig(**settings))  # type: ignore[arg-type]


def waiting_pipeline(**admission: object) -> ot.PipelineConfig:
    return build(
        "embedded",
        stage("streamer", "create_stream_then_wait", terminal=True),
        stream_admission=ot.StreamAdmissionConfig(**admission),  # type: ignore[arg-type]
        serve=ot.ServeConfig(model="toy", adapter="tests.serve.adapters.TrailAdapter", retry_after_s=3),
    )


async def test_a_stream_behind_its_deadline_refuses_pipeline_stream_with_queue_full() -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(waiting_pipeline(recover_s=0.3)) as pipeline:
            async with pipeline.stream("r0", "go") as events:
                first = await events.__anext__()
                assert isinstance(first, ot.StreamMessage) and first.chunk == "first"
                events.declare_playback(0.05)
                await trio.sleep(0.2)  # its 50 ms ran dry
                with pytest.raises(ot.QueueFullError, match=r"stream 'r1' refused: stream 'r0' has -0\.\d+s"):
                    async with pipeline.stream("r1", "go"):
                        pass
                events.declare_playback(60.0)  # late: it stalled, and plays on for a minute
                with pytest.raises(ot.QueueFullError, match=r"'r0' ran dry"):
                    async with pipeline.stream("r2", "go"):
                        pass
                await trio.sleep(0.4)  # recover_s without a stall
                async with pipeline.stream("r3", "go") as admitted:
                    assert (await admitted.__anext__()).chunk == "first"
            stats = await pipeline.stats()
            assert stats.refused_streams == 2
            assert stats.rejected_requests == 0


async def test_the_fixed_cap_answers_429_with_retry_after_over_http() -> None:
    config = waiting_pipeline(mode="fixed", max_streams=1)
    chat = {"model": "toy", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline, trio.open_nursery() as nursery:
            address = await nursery.start(ot.serve_http, pipeline, config, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=address.url, timeout=None) as client:
                async with client.stream("POST", "/v1/chat/completions", json=chat) as held:
                    assert held.status_code == 200
                    refused = await client.post("/v1/chat/completions", json=chat)
                    assert refused.status_code == 429, refused.text
                    assert refused.headers["retry-after"] == "3"
                    assert refused.json()["error"]["code"] == "queue_full"
                    assert "stream_admission.max_streams=1" in refused.json()["error"]["message"]
                metrics = (await client.get("/metrics")).text
            assert "omni_trio_streams_refused_total 1.0" in metrics
            nursery.cancel_scope.cancel()
