"""A link's send turns: first come, first served, urgent senders before the others, handed over on release."""

from __future__ import annotations

import trio
import trio.testing

from omni_trio.control.sockets.turns import SendTurns


async def test_urgent_waiters_are_served_first_and_each_kind_in_arrival_order() -> None:
    turns = SendTurns()
    served: list[str] = []

    async def sender(name: str, *, urgent: bool) -> None:
        await turns.take(urgent=urgent)
        served.append(name)
        turns.release()

    with trio.fail_after(5):
        turns.take_nowait()  # a sender is writing
        async with trio.open_nursery() as nursery:
            for name, urgent in [("a", False), ("b", False), ("X", True), ("c", False), ("Y", True)]:
                nursery.start_soon(lambda n=name, u=urgent: sender(n, urgent=u))
                await trio.testing.wait_all_tasks_blocked()
            assert served == [] and turns.busy()
            turns.release()
    assert served == ["X", "Y", "a", "b", "c"]
    assert not turns.busy()


async def test_a_waiter_cancelled_in_its_wait_leaves_the_queue_and_the_turn_goes_on() -> None:
    turns = SendTurns()
    served: list[str] = []
    given_up = trio.CancelScope()

    async def sender(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await turns.take(urgent=name == "gone")
            served.append(name)
            turns.release()

    with trio.fail_after(5):
        turns.take_nowait()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender, "gone", given_up)
            nursery.start_soon(sender, "kept", trio.CancelScope())
            await trio.testing.wait_all_tasks_blocked()
            given_up.cancel()
            await trio.testing.wait_all_tasks_blocked()
            turns.release()
    assert served == ["kept"]
    assert not turns.busy()
