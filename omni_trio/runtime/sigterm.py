"""SIGTERM shuts an open pipeline down as gracefully as Ctrl-C does.

Python's default SIGTERM action kills the process at once, and a killed
caller leaves its workers to clean up after it. While a pipeline is open in
the main thread and the program has no SIGTERM handler of its own (the action
is still the default), :func:`cancel_on_sigterm` takes SIGTERM for it: the
signal cancels the pipeline's scope, ``open_pipeline`` shuts down as on
Ctrl-C (requests aborted, stages drained, workers stopped, the IPC directory
and shared memory removed) and raises :class:`~omni_trio.errors.Terminated`.
A program that handles SIGTERM itself (``omni-trio serve``, anything under
``trio.open_signal_receiver``, ``signal.signal``) keeps its handler; every
pipeline open at once shares the one handler, which is put back when the last
one closes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import trio

# What the handler wakes: one entry per pipeline open in the main thread.
_listeners: dict[object, Callable[[], None]] = {}
_previous: Any = signal.SIG_DFL


class SigtermWatch:
    """Whether SIGTERM arrived while the pipeline was open."""

    def __init__(self) -> None:
        self.received = False


def _on_sigterm(signum: int, frame: object) -> None:
    for wake in list(_listeners.values()):
        wake()


def _take_sigterm() -> bool:
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return False  # signals reach the main thread's trio run only
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return True
    if current is not signal.SIG_DFL:
        return False  # the program's own handler decides
    _previous = current
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


@contextlib.contextmanager
def cancel_on_sigterm(scope: trio.CancelScope) -> Iterator[SigtermWatch]:
    """While inside, SIGTERM cancels ``scope`` and sets the watch's ``received`` (if SIGTERM is ours to take)."""
    watch = SigtermWatch()
    if not _take_sigterm():
        yield watch
        return
    token = trio.lowlevel.current_trio_token()

    def fire() -> None:
        watch.received = True
        scope.cancel()

    def wake() -> None:
        # A signal handler may run in the middle of trio's own code: only hand the work to the loop.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(fire)

    key = object()
    _listeners[key] = wake
    try:
        yield watch
    finally:
        del _listeners[key]
        if not _listeners and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _previous)
