"""Sender, receiver, transfers and credits between real Endpoints on the in-memory sockets.

Stage ``a`` (process p_a) sends to stage ``b`` (p_b) through the real
:class:`~omni_trio.control.links.RemoteStageLink`; objects over the inline limit go through shared
memory and wait for their ACK, holding one of ``a``'s credits. Everything runs in one trio.run on
MockClock, so the times asserted are the control plane's own timeouts and waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import torch
import trio
import trio.testing

from omni_trio.control.links import RemoteStageLink
from omni_trio.control.transfers import ACK_TIMEOUT_S
from omni_trio.control.wire import messages as m
from omni_trio.errors import MessageTooLarge
from omni_trio.payload import OmniRequest, StagePayload, StreamItem
from tests.control.memory_plane import Plane, Recorder, open_plane

PLACEMENT = {"a": "p_a", "b": "p_b", "c": "p_c"}
#: Over the inline limit: it travels through shared memory.
BIG = 64 * 1024


def big(value: float) -> torch.Tensor:
    return torch.full((BIG // 4,), value, dtype=torch.float32)


def payload(request_id: str, data: object) -> StagePayload:
    return StagePayload(request_id, OmniRequest(inputs=None), data)


Test = Callable[[Plane, Recorder, Recorder, RemoteStageLink], Awaitable[None]]


def run(test: Test, *, credits: int = 2, reports_takes: bool = False) -> None:
    """Run ``test`` with stage a in p_a (``credits`` per target), b in p_b, and a's link to b."""

    async def main() -> None:
        with trio.fail_after(600):
            async with open_plane(PLACEMENT) as plane:
                a, b = Recorder("a"), Recorder("b", reports_takes=reports_takes)
                sender = await plane.start("p_a", credits={"a": credits}, a=a)
                await plane.start("p_b", b=b)
                await test(plane, a, b, RemoteStageLink(sender, "a", "b"))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def kinds(plane: Plane) -> list[tuple[str, str, str]]:
    return [(entry.sender, entry.receiver, type(entry.message).__name__) for entry in plane.network.log]


def test_a_shared_memory_payload_is_delivered_then_acked() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        await link.payload("r1", "a", payload("r1", big(1.0)), share=False)
        assert plane.endpoints["p_a"].relay_in_use("a") == 1  # waits for its ACK
        await b.wait_for(1)
        await trio.testing.wait_all_tasks_blocked()
        (delivered,) = b.delivered
        assert (delivered.what, delivered.request_id) == ("payload", "r1")
        assert torch.equal(delivered.value, big(1.0))
        assert kinds(plane)[:2] == [("p_a", "p_b", "DataReady"), ("p_b", "p_a", "DataAck")]
        assert plane.endpoints["p_a"].relay_in_use("a") == 0 and a.failures == []

    run(test)


def test_a_lost_ack_fails_the_request_at_the_sender_once_the_ack_timeout_passed() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        plane.network.drop("p_b", "p_a", m.DataAck)
        await link.payload("r1", "a", payload("r1", big(1.0)), share=False)
        await b.wait_for(1)  # delivered: only its ACK is lost
        await trio.sleep(ACK_TIMEOUT_S - 1)
        assert a.failures == [] and plane.endpoints["p_a"].relay_in_use("a") == 1
        await trio.sleep(2)
        error = f"transfer to 'b' failed: no ACK from 'b' within {ACK_TIMEOUT_S:g} s"
        assert a.failures == [(ACK_TIMEOUT_S, "r1", error)]
        assert plane.endpoints["p_a"].relay_in_use("a") == 0

    run(test)


def test_a_duplicated_ack_settles_its_transfer_once() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        plane.network.duplicate("p_b", "p_a", m.DataAck)
        for index in range(3):  # one credit: each waits for the ACK before it
            await link.payload(f"r{index}", "a", payload(f"r{index}", big(index)), share=False)
        await b.wait_for(3)
        await trio.sleep(ACK_TIMEOUT_S + 1)
        assert len(plane.network.sent(m.DataAck)) == 3  # one of them twice over the wire
        assert [d.request_id for d in b.delivered] == ["r0", "r1", "r2"]
        assert a.failures == [] and plane.endpoints["p_a"].relay_in_use("a") == 0

    run(test, credits=1)


def test_a_sender_out_of_credits_waits_for_an_ack() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        plane.network.hold("p_b", "p_a")  # the ACKs are late
        await link.payload("r1", "a", payload("r1", big(1.0)), share=False)
        sent = trio.Event()

        async def second() -> None:
            await link.payload("r2", "a", payload("r2", big(2.0)), share=False)
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.sleep(10)
            assert not sent.is_set() and [d.request_id for d in b.delivered] == ["r1"]
            await plane.network.release("p_b", "p_a")
        await b.wait_for(2)
        assert [(d.time, d.request_id) for d in b.delivered] == [(0.0, "r1"), (10.0, "r2")]

    run(test, credits=1)


def test_a_credit_the_receiver_holds_comes_back_once_its_chunk_is_taken() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        await link.stream_chunks("r1", "a", [StreamItem(0, big(0.0), "a")])
        await b.wait_for(1)
        (ack,) = [entry.message for entry in plane.network.sent(m.DataAck)]
        assert isinstance(ack, m.DataAck) and ack.credit_held
        sent = trio.Event()

        async def second() -> None:
            await link.stream_chunks("r1", "a", [StreamItem(1, big(1.0), "a")])
            sent.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            await trio.sleep(5)
            assert not sent.is_set()  # ACKed, but the credit is b's until its scheduler takes chunk 0
            (take,) = b.takes
            take()
        await b.wait_for(2)
        assert [(d.time, d.value[0][0]) for d in b.delivered] == [(0.0, 0), (5.0, 1)]
        assert len(plane.network.sent(m.CreditReturn, "p_b", "p_a")) == 1

    run(test, credits=1, reports_takes=True)


def test_a_signal_is_delivered_after_the_chunk_read_before_it() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        # The chunk is read from shared memory in a task; the inline signal behind it needs no read.
        await link.stream_chunks("r1", "a", [StreamItem(0, big(0.0), "a")])
        await link.stream_chunks("r1", "a", [StreamItem(1, "small", "a")])
        await link.stream_signal("r1", "a")
        await b.wait_for(3)
        assert [(d.what, d.value if d.what != "chunks" else d.value[0][0]) for d in b.delivered] == [
            ("chunks", 0),
            ("chunks", 1),
            ("signal", None),
        ]

    run(test)


def test_messages_of_one_sender_stay_in_order_when_another_connection_overtakes_them() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        other = RemoteStageLink(await plane.start("p_c", c=Recorder("c")), "c", "b")
        plane.network.hold("p_a", "p_b")
        for chunk in range(3):
            await link.stream_chunks("r1", "a", [StreamItem(chunk, f"chunk {chunk}", "a")])
        await link.stream_signal("r1", "a")
        await other.payload("r2", "c", payload("r2", "from c"), share=False)
        await b.wait_for(1)
        await plane.network.release("p_a", "p_b")
        await b.wait_for(5)
        assert [(d.request_id, d.what) for d in b.delivered] == [
            ("r2", "payload"),
            ("r1", "chunks"),
            ("r1", "chunks"),
            ("r1", "chunks"),
            ("r1", "signal"),
        ]
        assert [d.value[0][0] for d in b.delivered if d.what == "chunks"] == [0, 1, 2]

    run(test)


def test_a_peer_gone_mid_transfer_settles_its_transfers_without_failing_them_here() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        plane.network.hold("p_a", "p_b")  # the DataReady is on its way...
        await link.payload("r1", "a", payload("r1", big(1.0)), share=False)
        plane.network.kill("p_b")  # ...when p_b dies
        await plane.network.release("p_a", "p_b")
        sender = plane.endpoints["p_a"]
        assert sender.undeliverable == 1 and b.delivered == []
        assert sender.relay_in_use("a") == 1
        sender.forget_peer("p_b")  # what the runtime does once it saw the death
        assert sender.relay_in_use("a") == 0
        await trio.sleep(ACK_TIMEOUT_S + 1)
        assert a.failures == []  # the request fails with the process, not once per transfer
        # The credit came back: the next transfer (to p_b's next incarnation) is not held up.
        plane.endpoints["p_b"].stop()
        b_again = Recorder("b")
        await plane.start("p_b", b=b_again)
        await link.payload("r2", "a", payload("r2", big(2.0)), share=False)
        await b_again.wait_for(1)
        assert b_again.delivered[0].time == ACK_TIMEOUT_S + 1

    run(test, credits=1)


def test_a_message_over_the_size_cap_is_refused_at_the_sender() -> None:
    async def test(plane: Plane, a: Recorder, b: Recorder, link: RemoteStageLink) -> None:
        with pytest.raises(MessageTooLarge):  # the plane's cap is 1 MiB
            await plane.endpoints["p_a"].send("p_b", m.HeldReport(process="p_a", request_ids=["x" * (1 << 20)]))
        assert plane.network.sent(m.HeldReport) == []

    run(test)
