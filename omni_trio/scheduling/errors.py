"""Errors raised by schedulers (they reach the caller as request failures)."""

from __future__ import annotations

from omni_trio.errors import QueueFullError

__all__ = ["QueueFullError"]
