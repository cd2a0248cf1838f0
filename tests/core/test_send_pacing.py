"""Send pacing: a burst of submits starts sending a few per pass of the loop, oldest first; a lone
request never waits; a request aborted while it waits never leaves the caller, and its submit
raises at once."""

from __future__ import annotations

import itertools
from typing import Any

import trio
import trio.testing

import omni_trio as ot
from omni_trio.coordinator.send_pacing import PER_PASS, SendPacing
from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler

#: Request ids the recording stage computed (embedded: it runs in the test's process).
COMPUTED: list[str] = []


def create_recorder() -> SimpleScheduler:
    """A stage that notes each request it computes."""

    def record(payload: StagePayload) -> StagePayload:
        COMPUTED.append(payload.request_id)
        return payload

    return SimpleScheduler(record, inline=True)


class PassSizes(trio.abc.Instrument):
    """How many turns had been taken at the end of each pass of the loop."""

    def __init__(self, taken: list[int]) -> None:
        self.taken = taken
        self.at_pass_end: list[int] = []

    def before_io_wait(self, timeout: float) -> None:
        self.at_pass_end.append(len(self.taken))


async def test_a_burst_starts_sending_a_few_per_pass_oldest_first() -> None:
    taken: list[int] = []
    called: list[int] = []
    passes = PassSizes(taken)
    trio.lowlevel.add_instrument(passes)
    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:  # its task ends once nobody waits
                pacing = SendPacing(nursery)

                async def sender(index: int) -> None:
                    called.append(index)
                    await pacing.turn(index)
                    taken.append(index)

                for index in range(10 * PER_PASS + 1):
                    nursery.start_soon(sender, index)
    finally:
        trio.lowlevel.remove_instrument(passes)
    assert sorted(taken) == list(range(10 * PER_PASS + 1))
    steps = [after - before for before, after in itertools.pairwise(passes.at_pass_end)]
    assert max(steps) <= PER_PASS  # never more than PER_PASS sends start in one pass
    # Those that waited went in the order they came, PER_PASS a pass (trio runs a pass's tasks in any order).
    waves = range(PER_PASS, len(called), PER_PASS)
    assert [set(taken[at:at + PER_PASS]) for at in waves] == [set(called[at:at + PER_PASS]) for at in waves]


async def test_a_caller_sending_one_request_at_a_time_never_waits() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            pacing = SendPacing(nursery)
            for index in range(10 * PER_PASS):
                await trio.sleep(0.002)  # one request per pass, as a sequential caller sends them
                with trio.testing.assert_no_checkpoints():
                    await pacing.turn(index)


async def test_a_request_aborted_while_it_waits_for_its_turn_is_never_sent() -> None:
    COMPUTED.clear()
    config = ot.PipelineConfig(stages=[ot.StageConfig(name="record", factory_path=f"{__name__}.create_recorder",
                                                      terminal=True)])
    outcomes: dict[str, Any] = {}
    with trio.fail_after(30):
        async with ot.open_pipeline(config) as pipeline:

            async def submit(request_id: str) -> None:
                try:
                    outcomes[request_id] = await pipeline.submit(request_id, "x")
                except ot.RequestAborted as exc:
                    outcomes[request_id] = exc

            async with trio.open_nursery() as nursery:
                for index in range(100 * PER_PASS):
                    nursery.start_soon(submit, f"r{index}")
                # Two passes: every submit is admitted, PER_PASS of them are sending, the rest wait.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
                # The middle one: trio runs a pass's tasks in order or reversed, so it waits ~50 passes.
                middle = f"r{50 * PER_PASS}"
                assert await pipeline.abort(middle) is True
                # Its submit raises at once, not when its turn would have come (~50 passes on).
                for _ in range(5):
                    await trio.lowlevel.checkpoint()
                assert isinstance(outcomes.get(middle), ot.RequestAborted)
                assert len(outcomes) < 50 * PER_PASS
    assert isinstance(outcomes[middle], ot.RequestAborted)
    assert middle not in COMPUTED and len(COMPUTED) == 100 * PER_PASS - 1
    assert sum(isinstance(outcome, BaseException) for outcome in outcomes.values()) == 1

