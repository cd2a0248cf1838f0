"""Shim for ``sglang.srt.utils`` (omni-trio's own code, used only by ``benchmarks.sglang``'s children).

The real package's ``__init__`` star-imports ``common``, which imports triton and the serving stack.
SGLang-Omni's stage workers import only ``kill_itself_when_parent_died`` from it: this module
provides that (our own few lines) and serves the real submodules by extending ``__path__``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _candidate = os.path.join(os.path.abspath(_entry or "."), "sglang", "srt", "utils")
    if _candidate != _HERE and os.path.isfile(os.path.join(_candidate, "__init__.py")):
        __path__.append(_candidate)
        break


def kill_itself_when_parent_died() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a no-op elsewhere)."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6").prctl(pr_set_pdeathsig, signal.SIGKILL)
