"""The control plane of a few processes inside one ``trio.run``: real Endpoints on the in-memory backend.

Each process's :class:`~omni_trio.control.endpoint.Endpoint` is the real one (peers, dispatcher,
sender, receiver, transfers, releases); only its sockets are in memory
(:mod:`omni_trio.control.sockets.memory`), so a test runs on ``trio.testing.MockClock`` and injects
the faults the real sockets never produce on their own. Objects bigger than the inline limit go
through real shared memory (each endpoint's relay unlinks its segments when it stops).

A stage here is a :class:`Recorder`: it keeps what the endpoint delivered to it, in order, with
the clock's time, which is what the tests assert on.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from omni_trio.comm.segments import remove_segments
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.sockets.memory import MemoryNetwork
from omni_trio.control.sockets.zmq_trio import SocketPolicy
from omni_trio.control.wire.auth import FrameMac, new_secret
from omni_trio.payload import StagePayload, StreamItem
from omni_trio.tracing.trace import Tracer

_runs = itertools.count()


@attrs.frozen
class Delivered:
    """One call the endpoint made on a stage: ``what`` (``submit``, ``payload``, ``chunks``,
    ``signal``), the request, what it carried, and when."""

    time: float
    what: str
    request_id: str
    value: Any


class Recorder:
    """A stage of a worker process as its endpoint sees it (the HostedStage members), recording."""

    def __init__(self, address: str, *, reports_takes: bool = False) -> None:
        self._address = address
        self._reports_takes = reports_takes
        self.delivered: list[Delivered] = []
        self.failures: list[tuple[float, str, str]] = []
        self.aborts: list[tuple[float, tuple[str, ...]]] = []
        self.active: set[str] = set()
        self.aborted: set[str] = set()
        #: The ``on_taken`` of each chunk delivery (a test plays the scheduler taking them).
        self.takes: list[Callable[[], object]] = []
        self.arrived = trio.Event()

    @property
    def address(self) -> str:
        return self._address

    @property
    def reports_takes(self) -> bool:
        return self._reports_takes

    def _record(self, what: str, request_id: str, value: Any) -> None:
        self.delivered.append(Delivered(trio.current_time(), what, request_id, value))
        self.active.add(request_id)
        self.arrived.set()
        self.arrived = trio.Event()

    async def on_submit(self, payload: StagePayload, bindings: dict[str, int] | None = None) -> None:
        self._record("submit", payload.request_id, payload.data)

    async def deliver_payload(
        self, request_id: str, from_stage: str, payload: StagePayload, bindings: dict[str, int] | None = None
    ) -> None:
        self._record("payload", request_id, payload.data)

    async def deliver_stream_chunks(
        self,
        request_id: str,
        from_stage: str,
        items: list[StreamItem],
        on_taken: Callable[[], object] | None = None,
        bindings: dict[str, int] | None = None,
    ) -> bool:
        self._record("chunks", request_id, [(item.chunk_id, item.data) for item in items])
        if on_taken is None:
            return False
        self.takes.append(on_taken)
        return True

    async def deliver_stream_signal(
        self, request_id: str, from_stage: str, error: str | None = None, bindings: dict[str, int] | None = None
    ) -> None:
        self._record("signal", request_id, error)

    async def send_failure(self, request_id: str, error: str) -> None:
        self.failures.append((trio.current_time(), request_id, error))

    def abort_requests(self, request_ids: Collection[str]) -> None:
        self.aborts.append((trio.current_time(), tuple(request_ids)))
        self.aborted.update(request_ids)
        self.active.difference_update(request_ids)

    async def wait_for(self, count: int) -> None:
        """Until ``count`` deliveries were recorded."""
        while len(self.delivered) < count:
            await self.arrived.wait()


class Plane:
    """The endpoints of one test's processes on one :class:`MemoryNetwork` (see the module docstring)."""

    def __init__(self, nursery: trio.Nursery, network: MemoryNetwork, placement: dict[str, str], run: str) -> None:
        self.network = network
        self.placement = placement
        self._nursery = nursery
        self._run = run
        self._secret = new_secret()
        self._index = itertools.count()
        self.endpoints: dict[str, Endpoint] = {}
        #: Requests the main process failed because their inputs were not delivered: (time, id, error).
        self.submit_failures: list[tuple[float, str, str]] = []

    async def start(self, process: str, *, credits: dict[str, int] | None = None, **stages: Recorder) -> Endpoint:
        """Start the endpoint of ``process`` hosting ``stages`` (address -> recorder)."""
        policy = SocketPolicy(FrameMac(self._secret, process=process), 1 << 20)
        endpoint = Endpoint(
            process=process,
            sockets=self.network.sockets(process, policy),
            placement=self.placement,
            shm_prefix=f"{self._run}-{next(self._index)}",
            tracer=Tracer(None, process),
            credits=credits,
        )
        endpoint.host(stages)
        if process == "main":
            endpoint.on_submit_failure(self._submit_failed)
        await self._nursery.start(endpoint.serve)
        self.endpoints[process] = endpoint
        return endpoint

    def _submit_failed(self, request_id: str, error: str) -> None:
        self.submit_failures.append((trio.current_time(), request_id, error))


@asynccontextmanager
async def open_plane(placement: dict[str, str], *, capacity: int = 64) -> AsyncIterator[Plane]:
    """A :class:`Plane` whose endpoints stop (and unlink their shared memory) when the block ends."""
    run = f"otmem{os.getpid()}x{next(_runs)}"
    try:
        async with trio.open_nursery() as nursery:
            plane = Plane(nursery, MemoryNetwork(capacity), placement, run)
            try:
                yield plane
            finally:
                # Also when the test failed: an endpoint's serve is shielded from the test's cancel.
                for endpoint in plane.endpoints.values():
                    endpoint.stop()
    finally:
        assert remove_segments(run) == [], "an endpoint left shared memory behind"
