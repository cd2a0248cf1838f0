"""Errors raised by schedulers (they reach the caller as request failures)."""

from __future__ import annotations

from omni_trio.errors import QUEUE_FULL_TEXT, QueueFullError

__all__ = ["QUEUE_FULL_TEXT", "QueueFullError"]
