"""StreamingSimpleScheduler.abort() off the scheduler thread: it never blocks, and the note it
queues is consumed where a batch collector finds it, so it never cuts another request's batch."""

from __future__ import annotations

from .helpers import chunk, get_n, new_request, serving
from .test_streaming_scheduler import ChunkBatcher, Recorder


class WideBatcher(ChunkBatcher):
    stream_chunk_batch_max = 8


def test_a_queued_abort_of_one_request_does_not_cut_another_requests_chunk_batch() -> None:
    scheduler = WideBatcher()
    scheduler.inbox.put(chunk("b", 0, 0))
    scheduler.inbox.put(chunk("a", 0, 100))
    # From this (non-serving) thread abort() only queues a note: the serve loop clears "a".
    scheduler.abort("a")
    scheduler.inbox.put(chunk("b", 1, 1))
    scheduler.inbox.put(chunk("b", 2, 2))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 3)
    assert scheduler.batches == [["b:0", "b:1", "b:2"]]
    assert [o.data for o in outs] == [0, 1, 2]
    assert scheduler.cleared == ["a"]


def test_a_queued_abort_does_not_end_a_new_request_batch() -> None:
    sizes: list[int] = []

    def batch(payloads):
        sizes.append(len(payloads))
        return [payload.data for payload in payloads]

    scheduler = Recorder(batch_compute_fn=batch, max_batch_size=3)
    scheduler.inbox.put(new_request("r1", "x1"))
    scheduler.abort("gone")
    scheduler.inbox.put(new_request("r2", "x2"))
    scheduler.inbox.put(new_request("r3", "x3"))
    with serving(scheduler):
        outs = get_n(scheduler.outbox, 3)
    assert sorted(o.request_id for o in outs) == ["r1", "r2", "r3"]
    assert sizes == [3]
    # "gone" is cleared where its note is found; the others as they complete.
    assert scheduler.cleared == ["gone", "r1", "r2", "r3"]


def test_abort_off_the_serving_thread_does_not_wait_for_a_hook_holding_the_state_lock() -> None:
    scheduler = Recorder()
    with scheduler.state_lock:  # as a hook in the middle of a compute step would
        scheduler.abort("r1")  # returns at once: the note is cleared later on the serving thread
    assert scheduler.is_aborted("r1")
    with serving(scheduler):
        scheduler.inbox.put(chunk("r2", 0, 7))
        assert get_n(scheduler.outbox, 1)[0].data == 7
    assert scheduler.cleared == ["r1"]
