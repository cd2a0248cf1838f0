"""Session hooks for docs/sessions.md: a session's state is the words appended so far.

The first owner of a session splits each appended text into words and emits
one chunk per word; a later owner (``upper=True``) reads those chunks from
``context.upstream()`` and emits them upper-cased.
"""

from __future__ import annotations

import omni_trio as ot


class Words:
    """Per session: the words seen so far."""

    def __init__(self, upper: bool) -> None:
        self.upper = upper
        self.words: dict[str, list[str]] = {}

    def open(self, session_id: str, request: ot.OmniRequest) -> None:
        self.words[session_id] = []

    def append(self, chunk: str, payload: ot.StagePayload, context: ot.SessionContext) -> ot.StagePayload:
        words = [item["data"].upper() for item in context.upstream()] if self.upper else chunk.split()
        for word in words:
            self.words[context.session_id].append(word)
            context.emit(ot.TimedChunk(word))
        payload.data = {"words": len(self.words[context.session_id])}
        return payload

    def close(self, session_id: str) -> None:
        self.words.pop(session_id, None)


def create_session_words(upper: bool = False) -> ot.SessionScheduler:
    """A session stage; ``upper`` makes it a later owner that reads the previous owner's chunks."""
    return ot.SessionScheduler(Words(upper))
