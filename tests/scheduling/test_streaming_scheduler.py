"""StreamingSimpleScheduler (SPEC §5.3)."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from omni_trio.payload import StagePayload, StreamItem
from omni_trio.scheduling import OutgoingMessage, StageScheduler, StreamingSimpleScheduler

from .helpers import TIMEOUT, assert_quiet, chunk, done, get, get_n, new_request, serving


class ToyVocoderScheduler(StreamingSimpleScheduler):
    """Verbatim from the seed chapter: must work unchanged."""

    def __init__(self):
        super().__init__(compute_fn=None)
        self.decoded = {}

    def is_streaming_payload(self, payload):
        return True

    def on_stream_chunk(self, request_id, item):
        samples = (item.data * 100).tolist()
        self.decoded.setdefault(request_id, []).extend(samples)
        return [OutgoingMessage(request_id, "stream", data={"samples": samples}, metadata={"modality": "audio"})]

    def on_stream_done(self, request_id):
        payload = self.stream_payloads[request_id]
        payload.data = {"total_samples": len(self.decoded.pop(request_id, []))}
        return [OutgoingMessage(request_id, "result", data=payload)]


class Recorder(StreamingSimpleScheduler):
    """Streams when ``payload.data == "stream"``; records what the hooks saw."""

    def __init__(self, **options: Any) -> None:
        super().__init__(compute_fn=lambda p: p, **options)
        self.chunks: list[tuple[str, Any]] = []
        self.cleared: list[str] = []
        self.defer_done = False
        self.tail_before_payload = False

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        return payload.data == "stream"

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        self.chunks.append((request_id, item.data))
        return [OutgoingMessage(request_id, "stream", data=item.data)]

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        if self.defer_done:
            return None
        return [OutgoingMessage(request_id, "result", data="done")]

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        if self.tail_before_payload:
            return [OutgoingMessage(request_id, "stream", data="tail")]
        return []

    def clear_stream_state(self, request_id: str) -> None:
        self.cleared.append(request_id)


def test_satisfies_the_stage_contract() -> None:
    assert isinstance(ToyVocoderScheduler(), StageScheduler)


def test_seed_vocoder_with_chunks_and_done_before_payload() -> None:
    scheduler = ToyVocoderScheduler()
    with serving(scheduler):
        scheduler.inbox.put(chunk("r1", 0, torch.tensor([1, 2])))
        scheduler.inbox.put(chunk("r1", 1, torch.tensor([11, 12])))
        scheduler.inbox.put(done("r1"))
        first, second = get_n(scheduler.outbox, 2)
        assert_quiet(scheduler.outbox, 0.1)  # done waits for the payload
        assert "r1" in scheduler.pending_done
        scheduler.inbox.put(new_request("r1", "say something"))
        final = get(scheduler.outbox)
    assert first.data == {"samples": [100, 200]} and first.metadata == {"modality": "audio"}
    assert second.data == {"samples": [1100, 1200]}
    assert final.type == "result" and final.data.data == {"total_samples": 4}
    assert scheduler.stream_payloads == {} and scheduler.pending_done == set()


def test_payload_first_then_chunks_then_done() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        scheduler.inbox.put(new_request("r1", "stream"))
        scheduler.inbox.put(chunk("r1", 0, "a"))
        scheduler.inbox.put(done("r1"))
        outs = get_n(scheduler.outbox, 2)
    assert [(o.type, o.data) for o in outs] == [("stream", "a"), ("result", "done")]
    assert scheduler.cleared == ["r1"]


def test_done_before_payload_emits_owed_output_at_once() -> None:
    scheduler = Recorder()
    scheduler.tail_before_payload = True
    with serving(scheduler):
        scheduler.inbox.put(done("r1"))
        tail = get(scheduler.outbox)
        scheduler.inbox.put(new_request("r1", "stream"))
        final = get(scheduler.outbox)
    assert (tail.type, tail.data) == ("stream", "tail")
    assert (final.type, final.data) == ("result", "done")


def test_deferred_done_completes_through_complete_stream_request() -> None:
    scheduler = Recorder()
    scheduler.defer_done = True
    with serving(scheduler):
        scheduler.inbox.put(new_request("r1", "stream"))
        scheduler.inbox.put(done("r1"))
        assert_quiet(scheduler.outbox, 0.1)
        scheduler.complete_stream_request("r1", [OutgoingMessage("r1", "result", data="later")])
        final = get(scheduler.outbox)
    assert final.data == "later"
    assert "r1" not in scheduler.stream_payloads


def test_late_done_for_completed_request_is_ignored() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        scheduler.inbox.put(new_request("n1", "plain"))
        assert get(scheduler.outbox).type == "result"
        scheduler.inbox.put(done("n1"))  # its stream ended on another path than its payload came by
        assert_quiet(scheduler.outbox, 0.1)
    assert "n1" not in scheduler.pending_done
    assert "n1" not in scheduler.completed_request_ids
    assert scheduler.chunks == []


def test_a_completed_streaming_id_serves_a_new_stream_with_chunks_before_its_payload() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        for data in ("first", "second"):
            scheduler.inbox.put(chunk("r1", 0, data))
            scheduler.inbox.put(done("r1"))
            assert get(scheduler.outbox).data == data
            scheduler.inbox.put(new_request("r1", "stream"))
            assert (get(scheduler.outbox).type, scheduler.pending_done) == ("result", set())
    assert scheduler.chunks == [("r1", "first"), ("r1", "second")]
    assert scheduler.stream_payloads == {} and "r1" not in scheduler.completed_request_ids


def test_a_completed_streaming_id_serves_an_empty_stream() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        for _ in range(2):
            scheduler.inbox.put(done("r1"))  # no chunks at all, the done before the payload
            scheduler.inbox.put(new_request("r1", "stream"))
            assert (get(scheduler.outbox).type, scheduler.pending_done) == ("result", set())


def test_a_completed_non_streaming_id_serves_a_new_stream_after_the_late_done() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        scheduler.inbox.put(new_request("r1", "plain"))
        assert get(scheduler.outbox).data.data == "plain"
        scheduler.inbox.put(done("r1"))  # the first request's late done: ignored
        scheduler.inbox.put(chunk("r1", 0, "new"))  # the new request's stream
        scheduler.inbox.put(done("r1"))
        assert get(scheduler.outbox).data == "new"
        scheduler.inbox.put(new_request("r1", "stream"))
        assert get(scheduler.outbox).type == "result"
    assert scheduler.chunks == [("r1", "new")]


def test_non_streaming_completion_clears_state_its_early_chunks_made() -> None:
    scheduler = Recorder()
    with serving(scheduler):
        scheduler.inbox.put(chunk("r1", 0, "stray"))
        assert get(scheduler.outbox).data == "stray"
        scheduler.inbox.put(new_request("r1", "plain"))
        assert get(scheduler.outbox).type == "result"
    assert scheduler.cleared == ["r1"]  # nothing of it is left for a new request under the id


class ChunkBatcher(Recorder):
    can_batch_stream_chunks = True
    stream_chunk_batch_max = 3

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def on_stream_chunk_batch(self, items: list[tuple[str, StreamItem]]) -> None:
        self.batches.append([f"{rid}:{item.chunk_id}" for rid, item in items])
        super().on_stream_chunk_batch(items)


def test_chunk_batching_takes_queued_chunks_up_to_the_cap() -> None:
    scheduler = ChunkBatcher()
    for i in range(5):
        scheduler.inbox.put(chunk("r1", i, i))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 5)
    assert scheduler.batches == [["r1:0", "r1:1", "r1:2"], ["r1:3", "r1:4"]]
    assert [o.data for o in outs] == [0, 1, 2, 3, 4]


def test_chunk_batching_distinct_requests_ends_at_repeat() -> None:
    class Distinct(ChunkBatcher):
        stream_chunk_batch_distinct_requests = True

    scheduler = Distinct()
    for request_id, chunk_id in [("r1", 0), ("r2", 0), ("r1", 1), ("r2", 1)]:
        scheduler.inbox.put(chunk(request_id, chunk_id, chunk_id))
    with serving(scheduler):
        get_n(scheduler.outbox, 4)
    assert scheduler.batches == [["r1:0", "r2:0"], ["r1:1", "r2:1"]]


def test_aborted_ids_are_skipped_and_callback_runs_once() -> None:
    aborted: list[str] = []
    scheduler = Recorder(abort_callback=aborted.append)
    scheduler.abort("r1")
    scheduler.abort("r1")
    with serving(scheduler):
        scheduler.inbox.put(chunk("r1", 0, "x"))
        scheduler.inbox.put(done("r1"))
        scheduler.inbox.put(new_request("r1", "stream"))
        scheduler.inbox.put(chunk("r2", 0, "y"))
        out = get(scheduler.outbox)
    assert (out.request_id, out.data) == ("r2", "y")
    assert scheduler.chunks == [("r2", "y")]
    assert aborted == ["r1"]


def test_hook_error_fails_and_aborts_only_that_request() -> None:
    class Fragile(Recorder):
        def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
            if item.data == "bad":
                raise RuntimeError("decode failed")
            return super().on_stream_chunk(request_id, item)

    scheduler = Fragile()
    with serving(scheduler):
        scheduler.inbox.put(chunk("r1", 0, "bad"))
        scheduler.inbox.put(chunk("r1", 1, "ignored"))
        scheduler.inbox.put(chunk("r2", 0, "fine"))
        error, ok = get_n(scheduler.outbox, 2)
    assert (error.request_id, error.type) == ("r1", "error")
    assert (ok.request_id, ok.data) == ("r2", "fine")
    assert scheduler.is_aborted("r1")


def test_non_streaming_batch_defers_done_before_payload() -> None:
    sizes: list[int] = []

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        sizes.append(len(payloads))
        return payloads

    scheduler = Recorder(batch_compute_fn=batch, max_batch_size=4)
    scheduler.inbox.put(new_request("n1", "plain"))
    scheduler.inbox.put(done("s1"))
    scheduler.inbox.put(new_request("n2", "plain"))
    scheduler.inbox.put(new_request("s1", "stream"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 3)
    assert sizes == [2]
    assert [(o.request_id, o.type) for o in outs] == [("n1", "result"), ("n2", "result"), ("s1", "result")]


def test_non_streaming_batch_with_too_few_results_fails_the_whole_batch() -> None:
    scheduler = Recorder(batch_compute_fn=lambda payloads: payloads[:1], max_batch_size=4)
    scheduler.inbox.put(new_request("n1", "plain"))
    scheduler.inbox.put(new_request("n2", "plain"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 2)
    assert [(o.request_id, o.type) for o in outs] == [("n1", "error"), ("n2", "error")]
    assert str(outs[0].data) == "batch_compute_fn returned 1 results for 2 requests"


def test_lone_non_streaming_request_does_not_wait_for_window() -> None:
    scheduler = Recorder(batch_compute_fn=lambda ps: ps, max_batch_size=4, max_batch_wait_ms=60_000)
    with serving(scheduler):
        started = time.monotonic()
        scheduler.inbox.put(new_request("n1", "plain"))
        assert get(scheduler.outbox).request_id == "n1"
    assert time.monotonic() - started < TIMEOUT / 2


def test_window_waits_when_idle_if_asked() -> None:
    sizes: list[int] = []

    def batch(payloads: list[StagePayload]) -> list[StagePayload]:
        sizes.append(len(payloads))
        return payloads

    scheduler = Recorder(batch_compute_fn=batch, max_batch_size=2, max_batch_wait_ms=60_000, batch_wait_when_idle=True)
    with serving(scheduler):
        scheduler.inbox.put(new_request("n1", "plain"))
        assert_quiet(scheduler.outbox, 0.2)
        scheduler.inbox.put(new_request("n2", "plain"))
        get_n(scheduler.outbox, 2)
    assert sizes == [2]


def test_stop_wakes_blocked_start() -> None:
    scheduler = ToyVocoderScheduler()
    thread = threading.Thread(target=scheduler.start, daemon=True)
    thread.start()
    scheduler.enqueue(new_request("warm"))
    scheduler.enqueue(done("warm"))
    assert get(scheduler.outbox).type == "result"  # start() served a request: it now blocks on its inbox
    scheduler.stop()
    thread.join(2)
    assert not thread.is_alive()
