"""AbortDelivery between real Endpoints on the in-memory sockets, inside one trio.run on MockClock.

Batching, confirmation, resending with a doubling interval until confirmed, and ``forget`` (the
process is gone) are the delivery's whole logic; the network loses, duplicates or holds the messages
a test names. The real sockets are exercised by tests/reliability/test_abort_delivery.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

import trio
import trio.testing

from omni_trio.comm.dataref import DataRefKind
from omni_trio.comm.router import COORDINATOR
from omni_trio.control import aborts
from omni_trio.control.aborts import AbortDelivery
from omni_trio.control.wire import messages as m
from omni_trio.payload import OmniRequest, StagePayload
from tests.control.memory_plane import Plane, Recorder, open_plane

PLACEMENT = {"s1": "p1", "s2": "p2"}


def run(test: Callable[[Plane, AbortDelivery, Recorder, Recorder], Awaitable[None]], *, capacity: int = 64) -> None:
    """Run ``test`` with main's AbortDelivery and the stages of workers p1 and p2."""

    async def main() -> None:
        with trio.fail_after(600):
            async with open_plane(PLACEMENT, capacity=capacity) as plane:
                caller = await plane.start("main")
                s1, s2 = Recorder("s1"), Recorder("s2")
                await plane.start("p1", s1=s1)
                await plane.start("p2", s2=s2)
                delivery = AbortDelivery(caller)

                async def on_done(message: m.AbortDone) -> None:
                    delivery.on_done(message)

                caller.on(m.AbortDone, on_done)
                await test(plane, delivery, s1, s2)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def aborts_to(plane: Plane, process: str) -> list[tuple[float, m.Abort]]:
    return [(entry.time, entry.message) for entry in plane.network.sent(m.Abort, "main", process)]  # type: ignore[misc]


def test_an_abort_is_done_once_every_process_confirmed() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        plane.network.hold("p2", "main")  # p2's confirmation is late
        done = delivery.deliver("r1", ["p1", "p2"])
        await trio.testing.wait_all_tasks_blocked()
        assert [ids for _, ids in s1.aborts] == [("r1",)] and [ids for _, ids in s2.aborts] == [("r1",)]
        assert not done.done.is_set() and done.waiting == {"p2"}
        await plane.network.release("p2", "main")
        await trio.testing.wait_all_tasks_blocked()
        assert done.done.is_set()

    run(test)


def test_aborts_that_queue_behind_a_full_socket_go_as_one_message() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        busy, free = trio.Event(), trio.Event()

        async def on_stats(message: m.StatsRequest) -> None:  # p1's receive loop is busy in here
            busy.set()
            await free.wait()

        plane.endpoints["p1"].on(m.StatsRequest, on_stats)
        await plane.endpoints["main"].send("p1", m.StatsRequest(reply_to="main", token=1))
        await busy.wait()
        first = delivery.deliver("r0", ["p1"])
        await trio.testing.wait_all_tasks_blocked()  # in p1's inbox, which holds one message
        rest = [delivery.deliver(f"r{i}", ["p1"]) for i in range(1, 1001)]
        await trio.testing.wait_all_tasks_blocked()  # the next message waits for room
        free.set()
        await trio.testing.wait_all_tasks_blocked()
        sizes = [len(message.request_ids) for _, message in aborts_to(plane, "p1")]
        assert sizes == [1, aborts.MAX_BATCH, 1000 - aborts.MAX_BATCH]
        assert [ids for _, ids in s1.aborts] == [message.request_ids for _, message in aborts_to(plane, "p1")]
        assert first.done.is_set() and all(d.done.is_set() for d in rest)

    run(test, capacity=1)


def test_a_lost_confirmation_is_answered_by_a_resend_with_a_doubling_interval() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        plane.network.drop("p1", "main", m.AbortDone, count=4)  # the first four confirmations are lost
        start = trio.current_time()
        done = delivery.deliver("r1", ["p1"])
        await done.done.wait()
        sent = aborts_to(plane, "p1")
        # Sent at once, then again after 1 s, 2 s, 4 s, 8 s: the wait doubles up to RESEND_MAX_S, and
        # the fifth confirmation (the first not lost) ends it.
        assert [round(at - start, 6) for at, _ in sent] == [0.0, 1.0, 3.0, 7.0, 15.0]
        assert round(trio.current_time() - start, 6) == 15.0
        assert len({message.token for _, message in sent}) == 1  # the same message each time
        assert [round(at - start, 6) for at, _ in s1.aborts] == [0.0, 1.0, 3.0, 7.0, 15.0]  # each one arrived
        await trio.sleep(60)
        assert len(aborts_to(plane, "p1")) == 5  # confirmed: never sent again, and the queue sleeps

    run(test)


def test_a_lost_abort_is_resent_and_a_duplicated_confirmation_changes_nothing() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        plane.network.drop("main", "p1", m.Abort)
        plane.network.duplicate("p1", "main", m.AbortDone)
        start = trio.current_time()
        first = delivery.deliver("r1", ["p1"])
        await first.done.wait()
        assert round(trio.current_time() - start, 6) == aborts.RESEND_S
        assert [round(at - start, 6) for at, _ in s1.aborts] == [aborts.RESEND_S]
        second = delivery.deliver("r2", ["p1"])  # the duplicate of r1's confirmation does not confirm r2
        await second.done.wait()
        (_, to_p1) = aborts_to(plane, "p1")[-1]
        assert to_p1.request_ids == ("r2",)
        await trio.sleep(30)
        assert [ids for _, ids in s1.aborts] == [("r1",), ("r2",)]

    run(test)


def test_a_process_that_is_gone_is_no_longer_waited_for() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        plane.network.kill("p2")  # p2 died: what is sent to it is lost
        done = delivery.deliver("r1", ["p1", "p2"])
        await trio.sleep(5)
        assert done.waiting == {"p2"}
        assert [round(at, 6) for at, _ in aborts_to(plane, "p2")] == [0.0, 1.0, 3.0]  # resent meanwhile
        delivery.forget("p2")
        assert done.done.is_set() and s2.aborts == []
        await trio.sleep(30)
        assert len(aborts_to(plane, "p2")) == 3  # not resent any more
        # A process of the same name started again gets a fresh queue.
        plane.endpoints["p2"].stop()
        s2_again = Recorder("s2")
        await plane.start("p2", s2=s2_again)
        again = delivery.deliver("r2", ["p2"])
        await again.done.wait()
        assert [ids for _, ids in s2_again.aborts] == [("r2",)]

    run(test)


def test_waiters_are_released_at_the_bound_while_the_abort_goes_on_being_resent() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        plane.network.drop("p2", "main", m.AbortDone, count=100)  # p2 works on, its confirmations are lost
        start = trio.current_time()
        first = delivery.deliver("r1", ["p1", "p2"])
        await trio.sleep(2)
        second = delivery.deliver("r2", ["p1", "p2"])
        await first.released.wait()
        assert round(trio.current_time() - start, 6) == aborts.WAIT_BOUND_S
        assert first.waiting == {"p2"} and not first.done.is_set()
        await second.released.wait()  # each from its own start: one task keeps every bound
        assert round(trio.current_time() - start, 6) == 2 + aborts.WAIT_BOUND_S
        await trio.sleep(20)
        assert len(aborts_to(plane, "p2")) > 4  # still resent: the delivery goes on after its waiters left
        assert not second.done.is_set()

    run(test)


def test_an_abort_to_no_process_is_done_at_once() -> None:
    async def test(plane: Plane, delivery: AbortDelivery, s1: Recorder, s2: Recorder) -> None:
        assert delivery.deliver("r1", []).done.is_set()
        await trio.testing.wait_all_tasks_blocked()
        assert plane.network.sent(m.Abort) == []

    run(test)


class _OrderRecorder(Recorder):
    """A Recorder that also notes how many deliveries it had seen when each abort came."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.seen_at_abort: list[int] = []

    def abort_requests(self, request_ids: Collection[str]) -> None:
        self.seen_at_abort.append(len(self.delivered))
        super().abort_requests(request_ids)


def test_an_abort_queued_behind_the_submits_it_cancels_is_handled_before_them() -> None:
    async def main() -> None:
        with trio.fail_after(600):
            async with open_plane({"s1": "p1"}) as plane:
                caller = await plane.start("main")
                s1 = _OrderRecorder("s1")
                worker = await plane.start("p1", s1=s1)
                busy, free = trio.Event(), trio.Event()

                async def on_stats(message: m.StatsRequest) -> None:  # p1's receive loop is busy in here
                    busy.set()
                    await free.wait()

                worker.on(m.StatsRequest, on_stats)
                await caller.send("p1", m.StatsRequest(reply_to="main", token=1))
                await busy.wait()
                for i in range(5):
                    rid = f"r{i}"
                    await caller.send_object(
                        StagePayload(rid, OmniRequest(rid), {}),
                        request_id=rid,
                        sender=COORDINATOR,
                        receiver="s1",
                        kind=DataRefKind.stage_payload,
                        direction="submit",
                        make=lambda ref, rid=rid: m.Submit(request_id=rid, to_stage="s1", data_ref=ref),
                    )
                delivery = AbortDelivery(caller)
                delivery.deliver("r3", ["p1"])
                await trio.testing.wait_all_tasks_blocked()  # the Submits and the Abort wait in p1's inbox
                free.set()
                await trio.testing.wait_all_tasks_blocked()
                assert [d.request_id for d in s1.delivered] == ["r0", "r1", "r2", "r3", "r4"]
                # Taken from the inbox together, the Abort went first: a stage drops r3 before its Submit.
                assert s1.seen_at_abort == [0]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
