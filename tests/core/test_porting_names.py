"""Names and types as SGLang-Omni 0.1.9 has them, so its stage code and catch sites port unchanged."""

from __future__ import annotations

import pytest
import trio

import omni_trio as ot
from omni_trio.scheduling.errors import QueueFullError as SchedulingQueueFullError
from tests.core.test_failures import chain_with
from tests.placement import build, stage


def test_complete_message_takes_the_reference_field_order() -> None:
    failed = ot.CompleteMessage("r", "decode", False, error="boom")
    assert (failed.success, failed.result, failed.error) == (False, None, "boom")
    done = ot.CompleteMessage("r", "decode", True, {"text": "hi"})
    assert done.result == {"text": "hi"} and done.error is None
    assert done.to_dict() == {
        "type": "complete", "request_id": "r", "from_stage": "decode", "success": True,
        "result": {"text": "hi"}, "error": None,
    }
    assert ot.CompleteMessage.from_dict(done.to_dict()) == done


def test_stream_message_takes_the_reference_field_order() -> None:
    message = ot.StreamMessage("r", "talker", b"pcm", None, None, "audio", 3)
    assert (message.stage_name, message.modality, message.chunk_id) == ("talker", "audio", 3)
    as_dict = message.to_dict()
    assert as_dict["type"] == "stream" and as_dict["chunk_id"] == 3
    assert ot.StreamMessage.from_dict(as_dict) == message
    assert ot.StreamMessage.from_dict({"request_id": "r", "from_stage": "s", "chunk": 1}).chunk_id is None


def test_payloads_compare_by_value_and_round_trip_through_dicts() -> None:
    request = ot.OmniRequest("hello", {"temperature": 0.5}, {"tenant": "a"})
    payload = ot.StagePayload("r0", request, {"tokens": [1, 2]})
    assert payload == ot.StagePayload("r0", ot.OmniRequest("hello", {"temperature": 0.5}, {"tenant": "a"}),
                                      {"tokens": [1, 2]})
    assert payload != ot.StagePayload("r0", request, {"tokens": [1]})
    as_dict = payload.to_dict()
    assert as_dict == {
        "_type": "StagePayload", "request_id": "r0", "data": {"tokens": [1, 2]},
        "request": {"_type": "OmniRequest", "inputs": "hello", "params": {"temperature": 0.5},
                    "metadata": {"tenant": "a"}},
    }
    assert ot.StagePayload.from_dict(as_dict) == payload
    # The scheduler-local scratch fields take no part in equality (and never in the dict).
    payload.prefetched_chunks.append("chunk")
    assert ot.StagePayload.from_dict(as_dict) == payload


def test_the_reference_catch_sites_still_catch() -> None:
    assert issubclass(ot.RequestFailed, RuntimeError)
    assert issubclass(ot.FanInError, ValueError)
    assert ot.QueueFullError is SchedulingQueueFullError
    assert not issubclass(ot.RequestAborted, trio.Cancelled)
    fan_in = ot.AggregatedInput(["a", "b"], lambda inputs: inputs["a"])
    with pytest.raises(ValueError, match="not in wait_for"):
        fan_in.receive("r0", "c", ot.StagePayload("r0", ot.OmniRequest("x"), None))
    payload = ot.StagePayload("r0", ot.OmniRequest("x"), None)
    assert ot.DirectInput().receive("r0", "a", payload) is payload


async def test_a_failed_request_is_a_runtime_error_and_a_stream_ends_with_complete_messages(placement: str) -> None:
    with trio.fail_after(30):
        async with ot.open_pipeline(chain_with(placement, route_fn="tests.stages.route_raises")) as pipeline:
            with pytest.raises(RuntimeError, match="route_fn exploded"):
                await pipeline.submit("r0", "hello world")
        config = build(placement, stage("a", "create_append", factory={"tag": "a"}, terminal=True))
        async with ot.open_pipeline(config) as pipeline:
            events = [event async for event in pipeline.stream("r1", "x")]
    assert events == [ot.CompleteMessage("r1", "a", True, {"trail": ["x", "a"]})]
