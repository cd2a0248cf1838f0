"""Helpers shared by the data-plane tests."""

from __future__ import annotations

import torch


def copy_out(view: memoryview) -> torch.Tensor:
    """The typical consume of a segment: copy the mapping into fresh memory, drop the view."""
    out = torch.empty(view.nbytes, dtype=torch.uint8)
    src = torch.frombuffer(view, dtype=torch.uint8)
    out.copy_(src)
    del src
    return out
