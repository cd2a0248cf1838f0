"""ContinuousBatchingScheduler: joins between steps, per-step streaming, results, aborts, idling, errors,
stream input, and the scheduler in a pipeline (embedded and in a worker process)."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
import trio

import omni_trio as ot
from omni_trio.payload import StreamItem
from omni_trio.scheduling import BatchedRequest, ContinuousBatchingScheduler, Inbox, StepOutput
from tests.placement import build
from tests.scheduling.helpers import TIMEOUT, chunk, done, get, get_n, new_request, serving


class GatedStep:
    """A step that makes one chunk ``"<id>:<n>"`` per request and ends a request after ``payload.data``
    chunks; each call waits for a permit, so a test decides when the next step runs."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.started: queue.Queue[int] = queue.Queue()
        self.permits = threading.Semaphore(0)

    def __call__(self, batch: list[BatchedRequest]) -> list[StepOutput]:
        self.batches.append([request.request_id for request in batch])
        self.started.put(len(self.batches))
        assert self.permits.acquire(timeout=TIMEOUT), "the test never let this step run"
        outputs = []
        for request in batch:
            assert request.payload is not None
            request.state += 1
            outputs.append(StepOutput(chunk=f"{request.request_id}:{request.state}",
                                      done=request.state == request.payload.data))
        return outputs

    def next_started(self) -> int:
        """Wait until the next step starts; its number (from 1)."""
        return self.started.get(timeout=TIMEOUT)

    def run_one(self) -> None:
        """Let the step under way finish."""
        self.permits.release()


def gated(max_batch_size: int, **options: Any) -> tuple[ContinuousBatchingScheduler, GatedStep]:
    step = GatedStep()
    return ContinuousBatchingScheduler(step, max_batch_size=max_batch_size, join_fn=lambda request: 0,
                                       **options), step


def by_request(outputs: list[ot.OutgoingMessage]) -> dict[str, list[tuple[str, Any]]]:
    """Each request's messages in order: ``(type, chunk)`` for stream chunks, ``(type, result data)``."""
    seen: dict[str, list[tuple[str, Any]]] = {}
    for out in outputs:
        data = out.data.data if out.type == "result" else out.data
        seen.setdefault(out.request_id, []).append((out.type, data))
    return seen


class ProbeInbox(Inbox):
    """An inbox that says when its taker blocks on it: a ``get`` without a timeout on an empty queue."""

    def __init__(self) -> None:
        super().__init__()
        self.blocked = threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> ot.IncomingMessage:
        with self.mutex:
            if block and timeout is None and not self._qsize():
                self.blocked.set()
        message = super().get(block, timeout)
        self.blocked.clear()
        return message


class ProbedScheduler(ContinuousBatchingScheduler):
    """A scheduler whose inbox reports blocking."""

    def __init__(self, step_fn: Any, **options: Any) -> None:
        super().__init__(step_fn, **options)
        self.inbox: ProbeInbox = ProbeInbox()


# ---------------------------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"max_batch_size": 2.0}, "max_batch_size"),
        ({"join_fn": 3}, "join_fn"),
        ({"leave_fn": "no"}, "leave_fn"),
        ({"stream_input": 1}, "stream_input"),
    ],
)
def test_options_are_checked(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ContinuousBatchingScheduler(lambda batch: [], **options)


def test_step_fn_must_be_callable() -> None:
    with pytest.raises(ValueError, match="step_fn"):
        ContinuousBatchingScheduler(None)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- joins, chunks, results


def test_requests_join_between_steps_up_to_the_max_and_stream_each_step() -> None:
    scheduler, step = gated(max_batch_size=2)
    with serving(scheduler):
        scheduler.inbox.put(new_request("r0", 3))
        assert step.next_started() == 1
        # Arrive during step 1: r1 joins for step 2, r2 waits for a free slot.
        scheduler.inbox.put(new_request("r1", 3))
        scheduler.inbox.put(new_request("r2", 3))
        for number in range(2, 7):
            step.run_one()
            assert step.next_started() == number
        step.run_one()
        outputs = get_n(scheduler.outbox, 9 + 3)
    assert step.batches == [["r0"], ["r0", "r1"], ["r0", "r1"], ["r1", "r2"], ["r2"], ["r2"]]
    seen = by_request(outputs)
    for request_id in ("r0", "r1", "r2"):
        chunks = [("stream", f"{request_id}:{n}") for n in (1, 2, 3)]
        assert seen[request_id] == [*chunks, ("result", 3)]  # the result (its payload) after its last chunk


def test_a_step_may_stream_several_chunks_per_request_and_give_its_own_result() -> None:
    def step(batch: list[BatchedRequest]) -> list[Any]:
        return [[StepOutput(chunk="a", metadata={"n": 0}), StepOutput(chunk="b", metadata={"n": 1}),
                 StepOutput(done=True, result={"made": 2})] for _ in batch]

    scheduler = ContinuousBatchingScheduler(step)
    with serving(scheduler):
        scheduler.inbox.put(new_request("r0"))
        outputs = get_n(scheduler.outbox, 3)
    assert [(out.type, out.data, out.metadata) for out in outputs] == [
        ("stream", "a", {"n": 0}), ("stream", "b", {"n": 1}), ("result", {"made": 2}, None)]


def test_the_scheduler_blocks_on_its_inbox_when_idle() -> None:
    scheduler = ProbedScheduler(GatedStep(), max_batch_size=4, join_fn=lambda request: 0)
    step = scheduler.step_fn
    assert isinstance(step, GatedStep)
    with serving(scheduler):
        assert scheduler.inbox.blocked.wait(TIMEOUT)  # idle from the start: a get() with no timeout
        assert step.batches == []
        scheduler.inbox.put(new_request("r0", 2))
        for _ in range(2):
            step.next_started()
            step.run_one()
        get_n(scheduler.outbox, 3)
        # Done: back to a blocking get(), and no step ran with an empty batch.
        assert scheduler.inbox.blocked.wait(TIMEOUT)
        assert step.batches == [["r0"], ["r0"]]
        scheduler.inbox.put(new_request("r1", 1))  # and a new request wakes it
        step.next_started()
        step.run_one()
        assert [out.type for out in get_n(scheduler.outbox, 2)] == ["stream", "result"]


def test_a_finished_request_id_can_come_back_as_a_new_request() -> None:
    scheduler = ContinuousBatchingScheduler(lambda batch: [StepOutput(chunk=1, done=True) for _ in batch])
    with serving(scheduler):
        for _ in range(2):
            scheduler.inbox.put(new_request("r0", "again"))
            assert [out.type for out in get_n(scheduler.outbox, 2)] == ["stream", "result"]


# ------------------------------------------------------------------------------------------------ aborts


def test_an_aborted_request_leaves_before_the_next_step() -> None:
    left: list[str] = []
    scheduler, step = gated(max_batch_size=4, leave_fn=lambda request: left.append(request.request_id))
    with serving(scheduler):
        scheduler.inbox.put(new_request("r0", 4))
        scheduler.inbox.put(new_request("r1", 4))
        assert step.next_started() == 1
        step.run_one()
        assert step.next_started() == 2
        scheduler.abort("r0")  # during step 2: its output of step 2 is dropped too
        scheduler.abort("r0")  # a repeated abort changes nothing
        for number in (3, 4):
            step.run_one()
            assert step.next_started() == number
        step.run_one()
        outputs = get_n(scheduler.outbox, 1 + 4 + 1)
    assert step.batches == [["r0", "r1"], ["r0", "r1"], ["r1"], ["r1"]]
    seen = by_request(outputs)
    assert seen["r0"] == [("stream", "r0:1")]
    assert seen["r1"][-1] == ("result", 4)
    assert left == ["r0", "r1"]  # r0 once, when it was dropped; r1 when it finished
    assert scheduler.is_aborted("r0") and not scheduler.is_aborted("r1")


def test_an_aborted_waiting_request_never_joins() -> None:
    joined: list[str] = []

    def join(request: BatchedRequest) -> int:
        joined.append(request.request_id)
        return 0

    step = GatedStep()
    scheduler = ContinuousBatchingScheduler(step, max_batch_size=1, join_fn=join)
    with serving(scheduler):
        scheduler.inbox.put(new_request("r0", 1))
        assert step.next_started() == 1
        scheduler.inbox.put(new_request("r1", 1))
        scheduler.inbox.put(new_request("r2", 1))
        scheduler.abort("r1")
        step.run_one()
        assert step.next_started() == 2
        step.run_one()
        outputs = get_n(scheduler.outbox, 4)
    assert joined == ["r0", "r2"]
    assert step.batches == [["r0"], ["r2"]]
    assert set(by_request(outputs)) == {"r0", "r2"}


def test_an_abort_frees_the_slot_of_a_request_waiting_for_input_at_once() -> None:
    left = threading.Event()
    scheduler = ContinuousBatchingScheduler(
        lambda batch: [StepOutput(chunk=len(r.inputs)) for r in batch], stream_input=True,
        leave_fn=lambda request: left.set())
    with serving(scheduler):
        scheduler.inbox.put(chunk("r0", 0, "x"))
        assert get(scheduler.outbox).data == 1
        scheduler.abort("r0")  # the loop is blocked on its inbox: the abort wakes it
        assert left.wait(TIMEOUT)


# ------------------------------------------------------------------------------------------------ errors


def test_a_failing_step_fails_its_requests_and_the_scheduler_goes_on() -> None:
    left: list[str] = []

    def step(batch: list[BatchedRequest]) -> list[StepOutput]:
        if any(request.payload is not None and request.payload.data == "boom" for request in batch):
            raise RuntimeError("the step broke")
        return [StepOutput(chunk="ok", done=True) for _ in batch]

    scheduler = ContinuousBatchingScheduler(step, max_batch_size=4,
                                            leave_fn=lambda request: left.append(request.request_id))
    with serving(scheduler):
        scheduler.inbox.put_all([new_request("r0", "fine"), new_request("r1", "boom")])
        errors = get_n(scheduler.outbox, 2)
        scheduler.inbox.put(new_request("r2", "fine"))
        after = get_n(scheduler.outbox, 2)
    assert {(out.request_id, out.type, str(out.data)) for out in errors} == {
        ("r0", "error", "the step broke"), ("r1", "error", "the step broke")}
    assert sorted(left[:2]) == ["r0", "r1"]
    assert [(out.request_id, out.type) for out in after] == [("r2", "stream"), ("r2", "result")]


def test_per_request_failures_fail_only_that_request() -> None:
    def join(request: BatchedRequest) -> str:
        assert request.payload is not None
        if request.payload.data == "bad-join":
            raise ValueError("prefill refused")
        return str(request.payload.data)

    def step(batch: list[BatchedRequest]) -> list[Any]:
        outputs: dict[str, Any] = {"ok": StepOutput(chunk=1, done=True), "raises": KeyError("mine only"),
                                   "wrong": "not an output", "early-done": [StepOutput(done=True), StepOutput()]}
        return [outputs[request.state] for request in batch]

    scheduler = ContinuousBatchingScheduler(step, max_batch_size=8, join_fn=join)
    with serving(scheduler):
        scheduler.inbox.put_all([new_request(name, name) for name in ("bad-join", "raises", "wrong", "early-done",
                                                                      "ok")])
        seen = by_request(get_n(scheduler.outbox, 6))
    assert seen["ok"] == [("stream", 1), ("result", "ok")]
    assert [kind for kind, _ in seen["bad-join"]] == ["error"]
    assert str(seen["bad-join"][0][1]) == "prefill refused"
    assert isinstance(seen["raises"][0][1], KeyError)
    assert "expected a StepOutput" in str(seen["wrong"][0][1])
    assert "only the last StepOutput" in str(seen["early-done"][0][1])


def test_a_step_returning_the_wrong_number_of_outputs_fails_the_step() -> None:
    scheduler = ContinuousBatchingScheduler(lambda batch: [])
    with serving(scheduler):
        scheduler.inbox.put(new_request("r0"))
        out = get(scheduler.outbox)
    assert out.type == "error" and str(out.data) == "step_fn returned 0 outputs for 1 requests"


def test_stream_input_to_a_payload_driven_scheduler_fails_the_request() -> None:
    scheduler = ContinuousBatchingScheduler(lambda batch: [StepOutput() for _ in batch])
    with serving(scheduler):
        scheduler.inbox.put(chunk("r0", 0, "x"))
        out = get(scheduler.outbox)
    assert out.type == "error" and "stream_input=True" in str(out.data)


# ------------------------------------------------------------------------------------------ stream input


def relay_step(batch: list[BatchedRequest]) -> list[Any]:
    """Each new input chunk, upper-cased, streamed on; done once the stream ended and the payload is here."""
    outputs: list[Any] = []
    for request in batch:
        request.state += len(request.inputs)
        out = [StepOutput(chunk=item.data.upper()) for item in request.inputs]
        if request.stream_ended and request.payload is not None:
            request.payload.data = {"chunks": request.state}
            out.append(StepOutput(done=True))
        outputs.append(out)
    return outputs


def test_stream_input_requests_start_on_their_chunks_and_end_with_stream_and_payload() -> None:
    scheduler = ProbedScheduler(relay_step, stream_input=True, join_fn=lambda request: 0)
    with serving(scheduler):
        scheduler.inbox.put(chunk("r0", 0, "a"))  # before its payload: it joins on the chunk
        assert get(scheduler.outbox).data == "A"
        assert scheduler.inbox.blocked.wait(TIMEOUT)  # joined, but nothing to step: blocked
        scheduler.inbox.put_all([chunk("r0", 1, "b"), chunk("r0", 2, "c"), done("r0")])
        assert [out.data for out in get_n(scheduler.outbox, 2)] == ["B", "C"]
        assert scheduler.inbox.blocked.wait(TIMEOUT)  # the stream ended, the payload is still on its way
        scheduler.inbox.put(new_request("r0"))
        result = get(scheduler.outbox)
        scheduler.inbox.put(chunk("r0", 3, "late"))  # a late chunk of a finished request is ignored
        scheduler.inbox.put(new_request("r1"))
        scheduler.inbox.put(done("r1"))
        other = get(scheduler.outbox)
    assert (result.type, result.data.data) == ("result", {"chunks": 3})
    assert (other.request_id, other.type, other.data.data) == ("r1", "result", {"chunks": 0})


def test_a_stream_input_request_done_before_its_payload_needs_a_result() -> None:
    scheduler = ContinuousBatchingScheduler(lambda batch: [StepOutput(done=True) for _ in batch], stream_input=True)
    with serving(scheduler):
        scheduler.inbox.put(chunk("r0", 0, "a"))
        out = get(scheduler.outbox)
    assert out.type == "error" and "before its payload arrived" in str(out.data)


def test_the_step_gets_the_stream_items_and_may_finish_before_the_payload_with_a_result() -> None:
    seen: list[Any] = []

    def step(batch: list[BatchedRequest]) -> list[StepOutput]:
        seen.extend(batch[0].inputs)
        return [StepOutput(done=True, result="r") for _ in batch]

    scheduler = ContinuousBatchingScheduler(step, stream_input=True)
    with serving(scheduler):
        scheduler.inbox.put(chunk("r0", 0, "a"))
        out = get(scheduler.outbox)
    assert [(item.chunk_id, item.data, item.from_stage) for item in seen] == [(0, "a", "up")]
    assert all(isinstance(item, StreamItem) for item in seen)
    assert (out.type, out.data) == ("result", "r")


# -------------------------------------------------------------------------------------- in a pipeline


def count_step(batch: list[BatchedRequest]) -> list[StepOutput]:
    """One chunk (the step's number) per request; ``params["frames"]`` of them, then ``{"frames": n}``;
    ``params["fail_at"]`` makes that step raise."""
    outputs = []
    for request in batch:
        assert request.payload is not None
        params = request.payload.request.params
        request.state += 1
        if request.state == params.get("fail_at"):
            raise RuntimeError(f"step {request.state} of {request.request_id} broke")
        done = request.state == params["frames"]
        if done:
            request.payload.data = {"frames": request.state}
        outputs.append(StepOutput(chunk=request.state, done=done))
    return outputs


def create_counter() -> ContinuousBatchingScheduler:
    """Payload-driven: counts frames, streamed to the next stage."""
    return ContinuousBatchingScheduler(count_step, max_batch_size=2, join_fn=lambda request: 0)


def doubling_step(batch: list[BatchedRequest]) -> list[list[StepOutput]]:
    """Stream input: each upstream chunk doubled, to the caller; the result counts them."""
    outputs = []
    for request in batch:
        out = [StepOutput(chunk=item.data * 2) for item in request.inputs]
        request.state += len(request.inputs)
        if request.stream_ended and request.payload is not None:
            request.payload.data = {**request.payload.data, "doubled": request.state}
            out.append(StepOutput(done=True))
        outputs.append(out)
    return outputs


def create_doubler() -> ContinuousBatchingScheduler:
    """Stream-consuming: doubles every chunk of the counter's stream."""
    return ContinuousBatchingScheduler(doubling_step, stream_input=True, join_fn=lambda request: 0)


@pytest.mark.parametrize("omni_placement", ["embedded", "processes"], indirect=True)
async def test_continuous_batching_in_a_pipeline(placement: str) -> None:
    config = build(
        placement,
        ot.StageConfig(name="counter", factory_path=f"{__name__}.create_counter", next="doubler",
                       stream_to=["doubler"]),
        ot.StageConfig(name="doubler", factory_path=f"{__name__}.create_doubler", terminal=True,
                       can_accept_stream_before_payload=True),
        entry_stage="counter",
    )
    with trio.fail_after(60):
        async with ot.open_pipeline(config) as pipeline:
            chunks: dict[str, list[int]] = {}
            results: dict[str, Any] = {}

            async def one(request_id: str, frames: int) -> None:
                async with pipeline.stream(request_id, "go", params={"frames": frames}) as events:
                    async for event in events:
                        if isinstance(event, ot.StreamMessage):
                            chunks.setdefault(request_id, []).append(event.chunk)
                        else:
                            results[request_id] = event.result

            async with trio.open_nursery() as nursery:
                for index, frames in enumerate((3, 5, 2)):  # three requests, two slots
                    nursery.start_soon(one, f"r{index}", frames)
            with pytest.raises(ot.RequestFailed) as failed:
                await pipeline.submit("bad", "go", params={"frames": 4, "fail_at": 2})
            after = await pipeline.submit("after", "go", params={"frames": 1})
    assert chunks == {"r0": [2, 4, 6], "r1": [2, 4, 6, 8, 10], "r2": [2, 4]}
    assert results == {"r0": {"frames": 3, "doubled": 3}, "r1": {"frames": 5, "doubled": 5},
                       "r2": {"frames": 2, "doubled": 2}}
    assert failed.value.stage == "counter" and failed.value.error == "RuntimeError: step 2 of bad broke"
    assert after == {"frames": 1, "doubled": 1}
