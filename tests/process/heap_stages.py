"""A stage that reports what its worker's garbage collector tracks (for tests/process/test_heap.py)."""

from __future__ import annotations

import gc

from omni_trio import SimpleScheduler, StagePayload

#: Made when the module is imported (in the template too, where there is one).
IMPORTED = ["made at import"]


def _among_collected(obj: list[str]) -> bool:
    """Whether a collection would walk ``obj`` (a list: always tracked); frozen objects are in none of the
    generations ``gc.get_objects`` lists."""
    assert gc.is_tracked(obj)
    return any(candidate is obj for candidate in gc.get_objects())


def create_heap_report() -> SimpleScheduler:
    """Returns, per request: the permanent generation's size, and which of three objects a collection walks:
    one made at import, one made when the stage was built, one made for the request."""
    built = ["made at start-up"]

    def fn(payload: StagePayload) -> StagePayload:
        per_request = ["made for the request"]
        payload.data = {
            "frozen": gc.get_freeze_count(),
            "collected": {
                "import": _among_collected(IMPORTED),
                "start-up": _among_collected(built),
                "request": _among_collected(per_request),
            },
        }
        return payload

    return SimpleScheduler(fn)
