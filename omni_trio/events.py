"""What a streaming caller receives from ``pipeline.stream(...)``.

Fields, their order and the dict forms are SGLang-Omni's, so code that builds
or reads these messages ports unchanged: ``CompleteMessage(request_id,
from_stage, success, result, error)`` and ``StreamMessage(request_id,
from_stage, chunk, stage_id, stage_name, modality, chunk_id)``. Both compare
by value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class StreamMessage:
    """A partial output of a terminal stage.

    ``chunk_id`` counts from 0 per request and terminal stage, so
    ``(from_stage, chunk_id)`` is unique within a request. ``stage_name``
    (None) becomes ``from_stage``; ``stage_id`` is unused (kept for the reference's
    field order).
    """

    request_id: str
    from_stage: str
    chunk: Any
    stage_id: int | None = None
    stage_name: str | None = None
    modality: str | None = None
    chunk_id: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.stage_name is None:
            object.__setattr__(self, "stage_name", self.from_stage)

    def to_dict(self) -> dict[str, Any]:
        """The reference's dict form (``"type": "stream"``); ``chunk`` is kept as is."""
        return {"type": "stream", **attrs.asdict(self, recurse=False)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamMessage:
        """Build from :meth:`to_dict`'s form (missing optional fields take their defaults)."""
        optional = {key: data[key] for key in ("stage_id", "stage_name", "modality", "chunk_id") if key in data}
        return cls(data["request_id"], data["from_stage"], data.get("chunk"), **optional)


@attrs.frozen
class CompleteMessage:
    """A stage finished the request: ``success`` with its ``result``, or failed with ``error``."""

    request_id: str
    from_stage: str
    success: bool
    result: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The reference's dict form (``"type": "complete"``); ``result`` is kept as is."""
        return {"type": "complete", **attrs.asdict(self, recurse=False)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompleteMessage:
        """Build from :meth:`to_dict`'s form."""
        return cls(
            data["request_id"], data["from_stage"], data["success"], data.get("result"), data.get("error")
        )
