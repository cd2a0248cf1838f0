"""The hand-written thinker scheduler, driven through its queues without a pipeline."""

from __future__ import annotations

import queue

import torch

from examples.omni_speech import models, stages
from omni_trio import IncomingMessage, OmniRequest, OutgoingMessage, StagePayload
from tests.scheduling.helpers import assert_quiet, get, serving


def thinker_request(request_id: str, max_new_tokens: int) -> IncomingMessage:
    """A merged-encodings payload, as the thinker's fan-in hands it over."""
    text = torch.randn(6, models.D_MODEL, generator=torch.Generator().manual_seed(0))
    request = OmniRequest("hi", params={"max_new_tokens": max_new_tokens})
    payload = StagePayload(request_id, request, {"text": text, "audio": None, "audio_batch": 0})
    return IncomingMessage(request_id, "new_request", payload)


def until_result(outbox: queue.Queue[OutgoingMessage], request_id: str) -> list[OutgoingMessage]:
    """Outputs up to and including ``request_id``'s result."""
    outputs = [get(outbox)]
    while not (outputs[-1].type == "result" and outputs[-1].request_id == request_id):
        outputs.append(get(outbox))
    return outputs


def test_streams_each_token_then_the_result() -> None:
    thinker = stages.create_thinker()
    thinker.warm_up_serving_thread()
    with serving(thinker):
        thinker.inbox.put(thinker_request("r0", 5))
        outputs = until_result(thinker.outbox, "r0")
    streamed = [out.data for out in outputs[:-1]]
    assert [out.type for out in outputs] == ["stream"] * 5 + ["result"]
    assert all(t.dtype == torch.int64 and t.shape == (1,) for t in streamed)
    assert [int(t) for t in streamed] == outputs[-1].data.data["tokens"]
    assert [out.metadata["step"] for out in outputs[:-1]] == list(range(5))


def test_concurrent_requests_decode_interleaved() -> None:
    thinker = stages.create_thinker()
    with serving(thinker):
        thinker.inbox.put(thinker_request("r0", 40))
        thinker.inbox.put(thinker_request("r1", 40))
        outputs = until_result(thinker.outbox, "r0")
        outputs += until_result(thinker.outbox, "r1")
    # r1 streams while r0 is still decoding ...
    r0_done = next(i for i, out in enumerate(outputs) if out.type == "result")
    assert any(out.request_id == "r1" for out in outputs[:r0_done])
    # ... and, with the same input, decodes the same tokens.
    results = {out.request_id: out.data.data["tokens"] for out in outputs if out.type == "result"}
    assert results["r0"] == results["r1"] and len(results["r0"]) == 40


def test_abort_stops_generation_and_the_loop_keeps_serving() -> None:
    thinker = stages.create_thinker()
    with serving(thinker):
        thinker.inbox.put(thinker_request("long", 500))
        first = get(thinker.outbox)
        assert (first.request_id, first.type) == ("long", "stream")
        thinker.abort("long")
        # An id aborted before its payload arrives is never decoded.
        thinker.abort("early")
        thinker.inbox.put(thinker_request("early", 5))
        thinker.inbox.put(thinker_request("next", 3))
        outputs = until_result(thinker.outbox, "next")
        assert_quiet(thinker.outbox)
    assert {out.request_id for out in outputs} <= {"long", "next"}
    assert len(outputs) < 100 and not any(out.type == "result" and out.request_id == "long" for out in outputs)


def test_a_bad_request_fails_alone() -> None:
    thinker = stages.create_thinker()
    with serving(thinker):
        thinker.inbox.put(thinker_request("bad", 0))
        error = get(thinker.outbox)
        thinker.inbox.put(thinker_request("good", 2))
        outputs = until_result(thinker.outbox, "good")
    assert (error.request_id, error.type) == ("bad", "error") and "max_new_tokens" in str(error.data)
    assert [out.type for out in outputs] == ["stream", "stream", "result"]
