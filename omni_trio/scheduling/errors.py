"""Errors raised by schedulers (they reach the caller as request failures)."""

from __future__ import annotations

from omni_trio.errors import OmniTrioError


class QueueFullError(OmniTrioError):
    """A capacity limit was reached (open sessions, session state bytes)."""
