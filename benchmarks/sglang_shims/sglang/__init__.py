"""Shim for ``sglang`` (omni-trio's own code, used only by ``benchmarks.sglang``'s children).

The real ``sglang/__init__.py`` imports its whole serving stack (triton, transformers, ...), which
does not install on a CPU-only machine. SGLang-Omni's pipeline core only needs a few light
submodules, so this package skips that ``__init__`` and serves the real submodules from the
installed ``sglang`` directory by adding it to ``__path__``.

``sglang.srt.utils.common`` also imports ``triton`` (a GPU compiler) at module level, only to use it
in kernels the pipeline core never compiles. An empty stand-in module is registered for it, but only
after ``torch._dynamo`` (which SGLang-Omni's stage workers import anyway) has been imported, so that
torch's own "is triton installed?" checks, made and cached at import time, still see no triton.
"""

from __future__ import annotations

import os
import sys
import types

import torch._dynamo  # noqa: F401 - before the triton stand-in appears (see above)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _real_dir() -> str:
    """The installed ``sglang`` package directory (the first one on ``sys.path`` that is not this shim)."""
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or "."), "sglang")
        if candidate != _HERE and os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    raise ImportError("the sglang shim found no installed sglang package to extend")


__path__.append(_real_dir())
__version__ = "0.5.22"
sys.modules.setdefault("triton", types.ModuleType("triton", "omni-trio's empty stand-in for triton"))
