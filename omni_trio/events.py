"""What a streaming caller receives from ``pipeline.stream(...)``."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class StreamMessage:
    """A partial output of a terminal stage.

    ``chunk_id`` counts from 0 per request and terminal stage, so
    ``(from_stage, chunk_id)`` is unique within a request.
    """

    request_id: str
    from_stage: str
    chunk: Any
    chunk_id: int
    modality: str | None = None

    @property
    def stage_name(self) -> str:
        """The producing stage (the reference's name for ``from_stage``)."""
        return self.from_stage


@attrs.frozen
class CompleteMessage:
    """A terminal stage finished the request; ``result`` is its output."""

    request_id: str
    from_stage: str
    result: Any
    success: bool = True
    error: str | None = None
