"""Stage factories of the abort-delivery tests (imported by dotted path inside worker processes).

Each counted stage appends ``<request id> <start time>`` to a log file when its compute *starts*, so a
test can tell, across processes, whether a request was computed after its abort was confirmed (the
start time is ``time.monotonic()``: one clock for every process of the machine).
"""

from __future__ import annotations

import functools
import threading
import time

from omni_trio import OmniRequest, SimpleScheduler, StagePayload

#: The request input that makes a counted stage hold the GIL (see :func:`hold_gil`).
HOG = "hog"


def hold_gil(seconds: float) -> None:
    """Keep the GIL for about ``seconds`` without releasing it once, as a long C call does.

    ``sum`` over a ``range`` runs in C and never returns to the interpreter loop, so no other thread
    of the process (its trio loop included) runs until it returns.
    """
    sum(range(int(seconds / _seconds_per_item())))


@functools.cache
def _seconds_per_item() -> float:
    start = time.perf_counter()
    sum(range(1_000_000))
    return (time.perf_counter() - start) / 1_000_000


def create_counted(
    tag: str, log_path: str, sleep_s: float = 0.0, spin_s: float = 0.0, hog_s: float = 0.0
) -> SimpleScheduler:
    """Appends ``tag`` to the payload's trail after ``sleep_s`` seconds (the GIL released, as a model
    on a GPU) or ``spin_s`` seconds of CPU work holding the GIL, logging each compute start.

    With ``hog_s``, the request whose input is :data:`HOG` holds the GIL for ``hog_s`` seconds instead.
    """
    _seconds_per_item()
    lock = threading.Lock()
    log = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the stage

    def fn(payload: StagePayload) -> StagePayload:
        with lock:
            log.write(f"{payload.request_id} {time.monotonic():.6f}\n")
        if hog_s and payload.request.inputs == HOG:
            hold_gil(hog_s)
        elif spin_s:
            hold_gil(spin_s)
        elif sleep_s:
            time.sleep(sleep_s)
        data = payload.data
        trail = list(data["trail"]) if isinstance(data, dict) and "trail" in data else []
        payload.data = {"trail": [*trail, tag]}
        return payload

    return SimpleScheduler(fn)


def route_hog(request_id: str, output: StagePayload) -> str | list[str]:
    """``a``'s route: the :data:`HOG` request to the hog stage beside ``b``, every other one to ``b`` and ``c``."""
    return "h" if output.request.inputs == HOG else ["b", "c"]


def merge_from_b(inputs: dict[str, StagePayload]) -> StagePayload:
    """The fan-in ``c`` of ``a`` and ``b``: ``b``'s payload goes on (its trail has ``a`` already)."""
    return inputs["b"]


def only_c(request: OmniRequest) -> str:
    """A request is done once ``c`` completed, whatever the other terminal stages still do."""
    return "c"


def hog_terminal(request: OmniRequest) -> str:
    """The terminal stage a request completes at: the hog stage for :data:`HOG`, else ``c``."""
    return "h" if request.inputs == HOG else "c"


def read_starts(log_path: str) -> dict[str, list[float]]:
    """Each request id's compute start times in a counted stage's log."""
    starts: dict[str, list[float]] = {}
    with open(log_path, encoding="utf-8") as handle:
        for line in handle:
            request_id, at = line.split()
            starts.setdefault(request_id, []).append(float(at))
    return starts
