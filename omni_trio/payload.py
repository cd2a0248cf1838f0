"""The unit of work that travels between stages.

Names and constructor order match the reference runtime so that stage code
ports with an import change: ``StagePayload(request_id, request, data)``,
``OmniRequest(inputs, params, metadata)``, ``StreamItem(chunk_id, data,
from_stage, metadata)``. ``OmniRequest`` and ``StagePayload`` compare by value
and have the reference's ``to_dict()``/``from_dict()`` (``"_type"`` tagged);
those convert the classes only, so values such as tensors stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

#: ``OmniRequest.metadata`` key reserved for session operations.
SESSION_METADATA_KEY = "omni_session"


@attrs.define
class OmniRequest:
    """What the caller submitted: ``inputs`` plus free-form params and metadata."""

    inputs: Any
    params: dict[str, Any] = attrs.field(factory=dict)
    metadata: dict[str, Any] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"_type": "OmniRequest", "inputs", "params", "metadata"}``."""
        return {"_type": "OmniRequest", "inputs": self.inputs, "params": self.params, "metadata": self.metadata}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OmniRequest:
        """Build from :meth:`to_dict`'s form."""
        return cls(data.get("inputs"), dict(data.get("params") or {}), dict(data.get("metadata") or {}))


@attrs.define
class StagePayload:
    """One request's data as it moves from stage to stage.

    ``data`` is whatever the previous stage produced; stage code usually
    replaces it (``payload.data = {...}``) and returns the payload.
    ``prefetched_chunks`` and ``prefetched_stream_done`` are scheduler-local
    scratch fields: not constructor arguments and never sent between processes.
    """

    request_id: str
    request: OmniRequest
    data: Any = None
    prefetched_chunks: list[Any] = attrs.field(init=False, factory=list, eq=False, repr=False)
    prefetched_stream_done: bool = attrs.field(init=False, default=False, eq=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """``{"_type": "StagePayload", "request_id", "request": request.to_dict(), "data"}``."""
        return {
            "_type": "StagePayload",
            "request_id": self.request_id,
            "request": self.request.to_dict(),
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StagePayload:
        """Build from :meth:`to_dict`'s form (the scheduler-local fields start empty)."""
        request = data.get("request")
        return cls(
            data.get("request_id", ""),
            request if isinstance(request, OmniRequest) else OmniRequest.from_dict(request or {}),
            data.get("data"),
        )


@attrs.frozen(eq=False)
class StreamItem:
    """One upstream stream chunk as a scheduler receives it.

    ``from_stage`` is the logical name of the stage that produced the chunk;
    ``chunk_id`` counts from 0 per (request, producer, receiver).
    """

    chunk_id: int
    data: Any
    from_stage: str
    metadata: dict[str, Any] | None = None


@attrs.frozen(eq=False)
class RoutedPayloads:
    """A ``result`` that gives each next stage its own payload.

    ``payloads`` maps a target stage name to the payload it receives; targets
    still come from the stage's routing (``next`` or ``route_fn``).
    ``keep_request_state=True`` keeps the stage's per-request state after
    routing (for stages that will emit more for the same request).
    """

    payloads: dict[str, StagePayload]
    keep_request_state: bool = False
