"""SessionScheduler (SPEC §5.4)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from omni_trio.payload import SESSION_METADATA_KEY, OmniRequest, StagePayload
from omni_trio.scheduling import (
    IncomingMessage,
    QueueFullError,
    SessionContext,
    SessionScheduler,
    StageScheduler,
    TimedChunk,
)

from .helpers import TIMEOUT, assert_quiet, get, get_n, new_request, serving


def op(request_id: str, kind: str, session_id: str, **extra: Any) -> IncomingMessage:
    """A session operation request."""
    return new_request(request_id, request_id, {SESSION_METADATA_KEY: {"op": kind, "session_id": session_id, **extra}})


class Hooks:
    """Records hook calls per session and how many ran at once for a session."""

    def __init__(self, append_delay: float = 0.0) -> None:
        self.append_delay = append_delay
        self.lock = threading.Lock()
        self.log: dict[str, list[str]] = defaultdict(list)
        self.active: dict[str, int] = defaultdict(int)
        self.max_active: dict[str, int] = defaultdict(int)
        self.gates: dict[str, threading.Event] = {}
        self.bytes: dict[str, int] = {}

    def _enter(self, session_id: str, entry: str) -> None:
        with self.lock:
            self.log[session_id].append(entry)
            self.active[session_id] += 1
            self.max_active[session_id] = max(self.max_active[session_id], self.active[session_id])

    def _leave(self, session_id: str) -> None:
        with self.lock:
            self.active[session_id] -= 1

    def open(self, session_id: str, request: OmniRequest) -> None:
        self._enter(session_id, "open")
        self._leave(session_id)

    def append(self, chunk: Any, payload: StagePayload, context: SessionContext) -> Any:
        self._enter(context.session_id, f"append:{chunk}")
        try:
            gate = self.gates.get(payload.request_id)
            if gate is not None:
                gate.wait(TIMEOUT)
            time.sleep(self.append_delay)
            context.emit(TimedChunk(data=f"out:{chunk}", start_ms=0.0, end_ms=1.0))
            payload.data = {"appended": chunk}
            return payload
        finally:
            self._leave(context.session_id)

    def close(self, session_id: str) -> None:
        with self.lock:
            self.log[session_id].append("close")

    def state_bytes(self, session_id: str) -> int:
        return self.bytes.get(session_id, 0)


def results_by_id(messages: list[Any]) -> dict[str, Any]:
    return {m.request_id: m for m in messages if m.type in ("result", "error")}


def test_satisfies_the_stage_contract() -> None:
    assert isinstance(SessionScheduler(Hooks()), StageScheduler)


def test_operations_run_in_order_per_session() -> None:
    hooks = Hooks(append_delay=0.02)
    scheduler = SessionScheduler(hooks, max_concurrency=4)
    messages = []
    for session_id in ("A", "B"):
        messages.append(op(f"{session_id}-open", "open", session_id))
    for i in range(3):
        for session_id in ("A", "B"):
            messages.append(op(f"{session_id}-{i}", "append", session_id, chunk=i))
    for session_id in ("A", "B"):
        messages.append(op(f"{session_id}-close", "close", session_id))
    with serving(scheduler):
        for message in messages:
            scheduler.enqueue(message)
        # 10 results plus one emitted stream chunk per append.
        outs = get_n(scheduler.outbox, 16)
    results = results_by_id(outs)
    for session_id in ("A", "B"):
        assert hooks.log[session_id] == ["open", "append:0", "append:1", "append:2", "close"]
        assert hooks.max_active[session_id] == 1
        assert results[f"{session_id}-open"].data.data == {"opened": True}
        assert results[f"{session_id}-1"].data.data == {"appended": 1}
        assert results[f"{session_id}-close"].data.data == {"closed": True}
    streams = [m for m in outs if m.type == "stream"]
    assert {m.request_id for m in streams} == {f"{s}-{i}" for s in "AB" for i in range(3)}
    assert streams[0].data["start_ms"] == 0.0 and streams[0].metadata == {"modality": "text"}
    assert scheduler.open_session_ids() == []


def test_max_open_sessions() -> None:
    hooks = Hooks()
    scheduler = SessionScheduler(hooks, max_open_sessions=1)
    with serving(scheduler):
        scheduler.enqueue(op("o1", "open", "A"))
        assert get(scheduler.outbox).type == "result"
        scheduler.enqueue(op("o2", "open", "B"))
        refused = get(scheduler.outbox)
        scheduler.enqueue(op("o3", "open", "A"))
        duplicate = get(scheduler.outbox)
        scheduler.enqueue(op("c1", "close", "A"))
        assert get(scheduler.outbox).data.data == {"closed": True}
        scheduler.enqueue(op("o4", "open", "B"))
        reopened = get(scheduler.outbox)
    assert (refused.request_id, refused.type) == ("o2", "error")
    assert isinstance(refused.data, QueueFullError)
    assert (duplicate.type, type(duplicate.data)) == ("error", ValueError)
    assert (reopened.request_id, reopened.type) == ("o4", "result")


def test_state_budget_failure_closes_the_session() -> None:
    hooks = Hooks()
    scheduler = SessionScheduler(hooks, max_state_bytes_per_session=100)
    with serving(scheduler):
        scheduler.enqueue(op("open", "open", "A"))
        get(scheduler.outbox)
        hooks.bytes["A"] = 1000
        scheduler.enqueue(op("a1", "append", "A", chunk=1))
        outs = results_by_id(get_n(scheduler.outbox, 2))
    assert isinstance(outs["a1"].data, QueueFullError)
    assert hooks.log["A"][-1] == "close"
    assert scheduler.open_session_ids() == []


def test_close_of_unknown_session_answers_closed() -> None:
    scheduler = SessionScheduler(Hooks())
    with serving(scheduler):
        scheduler.enqueue(op("c", "close", "nobody"))
        assert get(scheduler.outbox).data.data == {"closed": True}


def test_reader_gets_emitted_chunks_and_answer_at_close() -> None:
    scheduler = SessionScheduler(Hooks())
    with serving(scheduler):
        scheduler.enqueue(op("open", "open", "A"))
        get(scheduler.outbox)
        scheduler.enqueue(op("read", "read", "A"))
        assert_quiet(scheduler.outbox, 0.1)  # a reader is answered only at close
        scheduler.enqueue(op("a1", "append", "A", chunk="x"))
        stream, appended = get_n(scheduler.outbox, 2)
        scheduler.enqueue(op("read2", "read", "A"))
        second_reader = get(scheduler.outbox)
        scheduler.enqueue(op("close", "close", "A"))
        outs = results_by_id(get_n(scheduler.outbox, 2))
    assert (stream.request_id, stream.type, stream.data["data"]) == ("read", "stream", "out:x")
    assert appended.request_id == "a1"
    assert (second_reader.request_id, second_reader.type) == ("read2", "error")
    assert outs["read"].data.data == {"closed": True}
    assert outs["close"].data.data == {"closed": True}


def test_requests_outside_sessions_use_compute_fn() -> None:
    with_fn = SessionScheduler(Hooks(), compute_fn=lambda p: p)
    without_fn = SessionScheduler(Hooks())
    with serving(with_fn), serving(without_fn):
        with_fn.enqueue(new_request("r1", "plain"))
        without_fn.enqueue(new_request("r1", "plain"))
        assert get(with_fn.outbox).type == "result"
        assert get(without_fn.outbox).type == "error"


def test_aborted_queued_operation_lets_later_ones_run() -> None:
    hooks = Hooks()
    hooks.gates["a1"] = threading.Event()
    scheduler = SessionScheduler(hooks, max_concurrency=4)
    with serving(scheduler):
        scheduler.enqueue(op("open", "open", "A"))
        get(scheduler.outbox)
        for i in (1, 2, 3):
            scheduler.enqueue(op(f"a{i}", "append", "A", chunk=i))
        scheduler.abort("a2")
        hooks.gates["a1"].set()
        outs = results_by_id(get_n(scheduler.outbox, 4))
        assert_quiet(scheduler.outbox, 0.1)
    assert set(outs) == {"a1", "a3"}
    assert hooks.log["A"] == ["open", "append:1", "append:3", "close"]  # close: at stop


def test_preempting_control_cancels_running_append() -> None:
    cancelled_seen: list[bool] = []
    started = threading.Event()

    class Preemptible(Hooks):
        def append(self, chunk: Any, payload: StagePayload, context: SessionContext) -> Any:
            started.set()
            cancelled_seen.append(context.cancelled.wait(TIMEOUT))
            return payload

    scheduler = SessionScheduler(Preemptible())
    with serving(scheduler):
        scheduler.enqueue(op("open", "open", "A"))
        get(scheduler.outbox)
        scheduler.enqueue(op("a1", "append", "A", chunk=1))
        assert started.wait(TIMEOUT)
        scheduler.enqueue(op("ctl", "control", "A", preempt=True))
        outs = results_by_id(get_n(scheduler.outbox, 2))
    assert cancelled_seen == [True]
    assert outs["ctl"].data.data == {"controlled": True}


def test_stop_closes_idle_sessions() -> None:
    hooks = Hooks()
    scheduler = SessionScheduler(hooks)
    with serving(scheduler):
        scheduler.enqueue(op("open", "open", "A"))
        get(scheduler.outbox)
    assert hooks.log["A"] == ["open", "close"]
    assert scheduler.open_session_ids() == []
