"""The unit of work that travels between stages.

Names and constructor order match the reference runtime so that stage code
ports with an import change: ``StagePayload(request_id, request, data)``,
``OmniRequest(inputs, params, metadata)``, ``StreamItem(chunk_id, data,
from_stage, metadata)``.
"""

from __future__ import annotations

from typing import Any

import attrs

#: ``OmniRequest.metadata`` key reserved for session operations.
SESSION_METADATA_KEY = "omni_session"


@attrs.define(eq=False)
class OmniRequest:
    """What the caller submitted: ``inputs`` plus free-form params and metadata."""

    inputs: Any
    params: dict[str, Any] = attrs.field(factory=dict)
    metadata: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
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
    prefetched_chunks: list[Any] = attrs.field(init=False, factory=list)
    prefetched_stream_done: bool = attrs.field(init=False, default=False)


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
