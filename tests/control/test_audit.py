"""HeldReporter inside one trio.run on trio's MockClock: the safety net's worker side reports what
is held a while after work arrived, every interval while anything is held, and nothing when idle."""

from __future__ import annotations

import trio
import trio.testing

from omni_trio.control.audit import REPORT_INTERVAL_S, HeldReporter


class Held:
    """The requests a worker's stages hold, and the reports made of them (with the mock time)."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.looks: list[float] = []
        self.reports: list[tuple[float, list[str]]] = []

    def held(self) -> list[str]:
        self.looks.append(trio.current_time())
        return list(self.ids)

    async def report(self, held: list[str]) -> None:
        self.reports.append((trio.current_time(), held))


def test_reports_follow_work_and_stop_when_nothing_is_held() -> None:
    requests = Held()
    held, reports = requests.ids, requests.reports

    async def main() -> None:
        reporter = HeldReporter(requests)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reporter.run)
            await trio.sleep(100)
            assert reports == []  # no work arrived: nothing is reported, the task sleeps
            start = trio.current_time()
            held.append("r1")
            reporter.want()
            reporter.want()  # more work before the report: still one report per interval
            await trio.sleep(3 * REPORT_INTERVAL_S + 0.5)
            assert [(round(at - start, 6), ids) for at, ids in reports] == [
                (REPORT_INTERVAL_S, ["r1"]),
                (2 * REPORT_INTERVAL_S, ["r1"]),
                (3 * REPORT_INTERVAL_S, ["r1"]),
            ]
            held.clear()  # the coordinator aborted it
            await trio.sleep(100)
            assert len(reports) == 3  # nothing held: no report, and no further round
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_letting_go_of_everything_calls_the_pending_look_off() -> None:
    # The usual end of a request: the worker's stages hold nothing any more, so the worker does not
    # even wake to look (an idle pipeline uses no CPU); work arriving again wants a look as before.
    requests = Held()
    held, looks = requests.ids, requests.looks

    async def main() -> None:
        reporter = HeldReporter(requests)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reporter.run)
            held.append("r1")
            reporter.want()
            await trio.sleep(REPORT_INTERVAL_S / 2)
            held.clear()  # r1 was routed on
            reporter.settle()
            await trio.sleep(100)
            assert looks == []
            start = trio.current_time()
            held.append("r2")  # r2 arrives and stays held (over for the coordinator, say)
            reporter.want()
            await trio.sleep(REPORT_INTERVAL_S + 0.5)
            assert [round(at - start, 6) for at in looks] == [REPORT_INTERVAL_S]
            assert [ids for _, ids in requests.reports] == [["r2"]]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
