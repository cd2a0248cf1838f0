"""What a stage does to its scheduler's inbox without the scheduler: purge a dropped request, count work."""

from __future__ import annotations

import collections
import queue
from collections.abc import Collection
from typing import Any

from omni_trio.scheduling.inbox import Inbox


def purge_inbox(inbox: Any, request_ids: Collection[str]) -> None:
    """Take retired requests' queued messages out of a scheduler's inbox (one sweep for them all).

    Schedulers skip aborted ids anyway; purging means they never even see
    them, and a retired request holds nothing in the stage afterwards. An
    inbox that is not a FIFO ``queue.Queue`` is left alone: only its scheduler
    can drop the messages.
    """
    if isinstance(inbox, Inbox):
        inbox.purge(*request_ids)  # runs the callbacks of tracked chunks (their credits go back)
        return
    if not isinstance(inbox, queue.Queue) or not isinstance(inbox.queue, collections.deque):
        return
    dropped = set(request_ids)
    with inbox.mutex:
        kept = [message for message in inbox.queue if message.request_id not in dropped]
        removed = len(inbox.queue) - len(kept)
        if removed:
            inbox.queue.clear()
            inbox.queue.extend(kept)
            inbox.unfinished_tasks -= removed
            inbox.not_full.notify_all()


def queued_work(inbox: Any) -> int:
    """Inbox messages that are work (a scheduler's own ``abort`` notes are cleanup)."""
    if not isinstance(inbox, queue.Queue):
        return int(inbox.qsize())
    with inbox.mutex:
        return sum(1 for message in inbox.queue if getattr(message, "type", None) != "abort")
