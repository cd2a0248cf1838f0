"""Shared helpers for the scheduler tests: payloads, bounded waits, a serving thread."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any

from omni_trio.payload import OmniRequest, StagePayload, StreamItem
from omni_trio.scheduling import IncomingMessage, OutgoingMessage

#: Test-side bound on every wait for scheduler output.
TIMEOUT = 10.0


def make_payload(request_id: str, data: Any = None, metadata: dict[str, Any] | None = None) -> StagePayload:
    """A payload whose request carries ``metadata``."""
    return StagePayload(request_id, OmniRequest(inputs=data, metadata=metadata or {}), data)


def new_request(request_id: str, data: Any = None, metadata: dict[str, Any] | None = None) -> IncomingMessage:
    """A ``new_request`` message for ``request_id``."""
    return IncomingMessage(request_id, "new_request", make_payload(request_id, data, metadata))


def chunk(request_id: str, chunk_id: int, data: Any) -> IncomingMessage:
    """A ``stream_chunk`` message from stage ``up``."""
    return IncomingMessage(request_id, "stream_chunk", StreamItem(chunk_id, data, "up"))


def done(request_id: str) -> IncomingMessage:
    """A ``stream_done`` message."""
    return IncomingMessage(request_id, "stream_done")


def get(outbox: queue.Queue[OutgoingMessage]) -> OutgoingMessage:
    """The next output, or fail the test after :data:`TIMEOUT`."""
    return outbox.get(timeout=TIMEOUT)


def get_n(outbox: queue.Queue[OutgoingMessage], count: int) -> list[OutgoingMessage]:
    """The next ``count`` outputs."""
    return [get(outbox) for _ in range(count)]


def assert_quiet(outbox: queue.Queue[OutgoingMessage], seconds: float = 0.2) -> None:
    """Assert nothing comes out within ``seconds``."""
    with contextlib.suppress(queue.Empty):
        unexpected = outbox.get(timeout=seconds)
        raise AssertionError(f"unexpected output {unexpected!r}")


def served_one(scheduler: Any) -> None:
    """Run one request through a started scheduler whose compute returns its payload: once its result
    is out, ``start()`` is serving and, with nothing else queued, waits on its inbox."""
    scheduler.enqueue(new_request("served-one"))
    assert get(scheduler.outbox).request_id == "served-one"


@contextlib.contextmanager
def serving(scheduler: Any) -> Iterator[threading.Thread]:
    """Run ``scheduler.start()`` on a thread; stop it and check it ended on exit."""
    thread = threading.Thread(target=scheduler.start, name="scheduler-test", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        scheduler.stop()
        thread.join(timeout=TIMEOUT)
        assert not thread.is_alive(), "start() did not return after stop()"
