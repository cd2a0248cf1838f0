"""Sessions end to end: operations travel as ordinary requests with ``metadata["omni_session"]``
(SPEC §3.12, §5.4), in every placement; ``pipeline.session(...)`` wraps them."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import omni_trio as ot
from tests.core.test_abort import wait_until
from tests.placement import build, stage


def one_owner(placement: str, **factory: Any) -> ot.PipelineConfig:
    return build(placement, stage("words", "create_word_session", factory=factory, terminal=True))


def two_owners(placement: str) -> ot.PipelineConfig:
    return build(
        placement,
        stage("front", "create_word_session", next="back", stream_to=["back"]),
        stage("back", "create_word_session", factory={"upper": True, "from_upstream": True}, terminal=True),
    )


def op(name: str, session_id: str, stages: list[str], **extra: Any) -> dict[str, Any]:
    return {"omni_session": {"op": name, "session_id": session_id, "stages": stages, **extra}}


def chunks(events: list[Any]) -> list[str]:
    return [event.chunk["data"] for event in events if isinstance(event, ot.StreamMessage)]


async def test_the_session_helper_appends_and_streams_their_output(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(one_owner(placement)) as pipeline:
            async with pipeline.session("s1", stages=["words"]) as session:
                assert await session.append("hello omni") == {"words": 2}
                assert await session.append("world") == {"words": 3}
                await session.close()
                events = [event async for event in session.events()]
            assert chunks(events) == ["hello", "omni", "world"]
            assert [e.result for e in events if isinstance(e, ot.CompleteMessage)] == [{"words": 2}, {"words": 3}]
            # Closed everywhere: the same id opens afresh, and nothing is held.
            async with pipeline.session("s1", stages=["words"]) as again:
                assert await again.append("x") == {"words": 1}
            assert (await pipeline.stats()).idle


async def test_an_append_streams_to_the_next_owner(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(two_owners(placement)) as pipeline:
            async with pipeline.session("s1", stages=["front", "back"]) as session:
                assert await session.append("streamed to back") == {"words": 3}
                assert await session.append("again") == {"words": 4}
            events = [event async for event in session.events()]
            assert chunks(events) == ["STREAMED", "TO", "BACK", "AGAIN"]
            assert {e.from_stage for e in events} == {"back"}
            # An append whose stages are not the pipeline's linear edges fails with a clear error.
            async with pipeline.session("s2", stages=["front"]) as wrong:
                with pytest.raises(ot.RequestFailed, match="session route must use fixed, linear payload edges"):
                    await wrong.append("x")
            assert (await pipeline.stats()).idle


async def test_read_receives_what_appends_emit_and_is_answered_at_close(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(one_owner(placement)) as pipeline:
            assert await pipeline.submit("open", None, metadata=op("open", "s1", ["words"])) == {"opened": True}
            read: list[Any] = []

            async def reader() -> None:
                async with pipeline.stream("read", None, metadata=op("read", "s1", ["words"])) as events:
                    async for event in events:
                        read.append(event)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                # The reader attaches on the stage's thread: until then an append's output is its own.
                n = 0
                while True:
                    own = [e async for e in pipeline.stream(f"a{n}", f"w{n}", metadata=op("append", "s1", ["words"]))]
                    n += 1
                    if not chunks(own):
                        break  # this append's output went to the reader
                closed = await pipeline.submit("close", None, metadata=op("close", "s1", ["words"]))
            assert closed == {"closed": True}
            assert chunks(read) == [f"w{n - 1}"]
            assert read[-1] == ot.CompleteMessage("read", "words", True, {"closed": True})
            assert (await pipeline.stats()).idle


async def test_control_preempts_appends_and_aborted_appends_leave_the_session_usable(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(one_owner(placement)) as pipeline:
            async with pipeline.session("s1", stages=["words"]) as session:

                async def active(count: int) -> bool:
                    return (await pipeline.stats()).stages["words"].active_requests == count

                results: dict[str, Any] = {}

                async def append(rid: str) -> None:
                    try:
                        results[rid] = await session.append("block", request_id=rid)
                    except ot.RequestAborted as exc:
                        results[rid] = exc

                async with trio.open_nursery() as nursery:
                    # preempt=True cuts the running append short; it still answers.
                    nursery.start_soon(append, "cut")
                    await wait_until(lambda: active(1))
                    assert await session.control(preempt=True) == {"controlled": True}
                assert results["cut"] == {"cancelled": True}

                async with trio.open_nursery() as nursery:
                    # preempted_request_ids aborts the request everywhere.
                    nursery.start_soon(append, "preempted")
                    await wait_until(lambda: active(1))
                    await session.control(preempted_request_ids=["preempted"])
                assert isinstance(results["preempted"], ot.RequestAborted)

                async with trio.open_nursery() as nursery:
                    # pipeline.abort of an in-flight append.
                    nursery.start_soon(append, "aborted")
                    await wait_until(lambda: active(1))
                    assert await pipeline.abort("aborted") is True
                assert isinstance(results["aborted"], ot.RequestAborted)
                assert await session.append("still open") == {"words": 2}
            assert (await pipeline.stats()).idle


async def test_close_runs_even_when_aborted_and_max_open_sessions_refuses(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(one_owner(placement, max_open_sessions=1)) as pipeline:
            s1 = pipeline.session("s1", stages=["words"])
            await s1.open()
            with pytest.raises(ot.QueueFullError, match="1 sessions are already open"):
                async with pipeline.session("s2", stages=["words"]):
                    pass

            async def active(count: int) -> bool:
                return (await pipeline.stats()).stages["words"].active_requests == count

            async def aborted(rid: str, inputs: str | None, name: str) -> None:
                with pytest.raises(ot.RequestAborted):
                    await pipeline.submit(rid, inputs, metadata=op(name, "s1", ["words"]))

            # A close queued behind a running append, then aborted, still runs once the append ends.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(aborted, "blocker", "block", "append")
                await wait_until(lambda: active(1))
                nursery.start_soon(aborted, "close", None, "close")
                await wait_until(lambda: active(2))
                assert await pipeline.abort("close") is True
                assert await pipeline.abort("blocker") is True
            # The aborted close runs on the stage's thread, after its caller heard of the abort: once it
            # did, the session is gone and another one fits under max_open_sessions=1.
            attempts = iter(range(1000))

            async def s2_opens() -> bool:
                try:
                    await pipeline.submit(f"open{next(attempts)}", None, metadata=op("open", "s2", ["words"]))
                except ot.QueueFullError:
                    return False
                return True

            await wait_until(s2_opens)
            assert await pipeline.submit("fits", "fits", metadata=op("append", "s2", ["words"])) == {"words": 1}
            await pipeline.submit("close2", None, metadata=op("close", "s2", ["words"]))
            assert (await pipeline.stats()).idle
