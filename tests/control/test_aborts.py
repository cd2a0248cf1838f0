"""AbortDelivery inside one trio.run: no sockets, a worker played by the test, trio's MockClock.

Batching, confirmation, resending with a doubling interval until confirmed, and ``forget`` (the
process is gone) are the delivery's whole logic; the real sockets are exercised by
tests/reliability/test_abort_delivery.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from omni_trio.control import aborts
from omni_trio.control.aborts import AbortDelivery
from omni_trio.control.wire import messages as m


class Wire:
    """What the delivery sends, per process, with the (mock) time it was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, m.Abort]] = []
        self.blocked: dict[str, trio.Event] = {}

    async def send(self, process: str, message: m.ControlMessage) -> None:
        assert isinstance(message, m.Abort)
        gate = self.blocked.get(process)
        if gate is not None:
            await gate.wait()  # a full socket: the send waits, it never drops
        self.sent.append((trio.current_time(), process, message))

    def to(self, process: str) -> list[m.Abort]:
        return [message for _, name, message in self.sent if name == process]


async def run_delivery(test: Callable[[AbortDelivery, Wire], Any]) -> None:
    wire = Wire()
    async with trio.open_nursery() as nursery:
        delivery = AbortDelivery(wire.send, nursery.start_soon)
        await test(delivery, wire)
        nursery.cancel_scope.cancel()


def test_an_abort_is_done_once_every_process_confirmed() -> None:
    async def test(delivery: AbortDelivery, wire: Wire) -> None:
        done = delivery.deliver("r1", ["p1", "p2"])
        await trio.testing.wait_all_tasks_blocked()
        (to_p1,) = wire.to("p1")
        (to_p2,) = wire.to("p2")
        assert to_p1.request_ids == ("r1",)
        delivery.on_done(m.AbortDone(token=to_p1.token, process="p1"))
        assert not done.done.is_set() and done.waiting == {"p2"}
        delivery.on_done(m.AbortDone(token=to_p1.token, process="p2"))  # another process's token: ignored
        assert not done.done.is_set()
        delivery.on_done(m.AbortDone(token=to_p2.token, process="p2"))
        assert done.done.is_set()

    trio.run(run_delivery, test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_aborts_that_queue_behind_a_full_socket_go_as_one_message() -> None:
    async def test(delivery: AbortDelivery, wire: Wire) -> None:
        wire.blocked["p1"] = trio.Event()
        first = delivery.deliver("r0", ["p1"])
        await trio.testing.wait_all_tasks_blocked()  # its send waits for the socket
        rest = [delivery.deliver(f"r{i}", ["p1"]) for i in range(1, 1001)]
        wire.blocked.pop("p1").set()
        await trio.testing.wait_all_tasks_blocked()
        sizes = [len(message.request_ids) for message in wire.to("p1")]
        assert sizes == [1, aborts.MAX_BATCH, 1000 - aborts.MAX_BATCH]
        for message in wire.to("p1"):
            delivery.on_done(m.AbortDone(token=message.token, process="p1"))
        assert first.done.is_set() and all(d.done.is_set() for d in rest)

    trio.run(run_delivery, test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_unconfirmed_abort_is_resent_with_a_doubling_interval_until_confirmed() -> None:
    async def test(delivery: AbortDelivery, wire: Wire) -> None:
        start = trio.current_time()
        done = delivery.deliver("r1", ["p1"])
        await trio.sleep(20)  # the worker never answers
        times = [round(at - start, 6) for at, _, _ in wire.sent]
        # Sent at once, then again after 1 s, 2 s, 4 s, 8 s, 8 s: the wait doubles up to RESEND_MAX_S.
        assert times == [0.0, 1.0, 3.0, 7.0, 15.0]
        assert len({message.token for _, _, message in wire.sent}) == 1  # the same message each time
        delivery.on_done(m.AbortDone(token=wire.sent[0][2].token, process="p1"))
        assert done.done.is_set()
        await trio.sleep(60)
        assert len(wire.sent) == 5  # confirmed: never sent again, and the lane sleeps

    trio.run(run_delivery, test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_process_that_is_gone_is_no_longer_waited_for() -> None:
    async def test(delivery: AbortDelivery, wire: Wire) -> None:
        wire.blocked["p2"] = trio.Event()  # p2's socket is full and stays so: it died
        done = delivery.deliver("r1", ["p1", "p2"])
        await trio.testing.wait_all_tasks_blocked()
        (to_p1,) = wire.to("p1")
        delivery.on_done(m.AbortDone(token=to_p1.token, process="p1"))
        assert done.waiting == {"p2"}
        delivery.forget("p2")  # its blocked send is cancelled with its lane
        assert done.done.is_set()
        await trio.sleep(30)
        assert wire.to("p2") == []
        # A process of the same name started again gets a fresh lane.
        again = delivery.deliver("r2", ["p2"])
        wire.blocked.pop("p2").set()
        await trio.testing.wait_all_tasks_blocked()
        (to_p2,) = wire.to("p2")
        delivery.on_done(m.AbortDone(token=to_p2.token, process="p2"))
        assert again.done.is_set()

    trio.run(run_delivery, test, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_abort_to_no_process_is_done_at_once() -> None:
    async def test(delivery: AbortDelivery, wire: Wire) -> None:
        assert delivery.deliver("r1", []).done.is_set()
        await trio.testing.wait_all_tasks_blocked()
        assert wire.sent == []

    trio.run(run_delivery, test, clock=trio.testing.MockClock(autojump_threshold=0))
