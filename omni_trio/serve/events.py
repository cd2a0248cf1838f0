"""JSON events over a WebSocket: parsing a client's event, and the ``error`` event that names a problem."""

from __future__ import annotations

import json
from typing import Any

from omni_trio.serve.json_body import InvalidJSON, parse_json


class BadEvent(Exception):
    """A client event the server cannot take; the connection goes on after an ``error`` event."""

    def __init__(self, message: str, *, code: str = "invalid_event", param: str | None = None,
                 event_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.event_id = event_id


def parse_event(text: str) -> dict[str, Any]:
    """A client's text message as a JSON object with a string ``type``; :class:`BadEvent` if it is not one.

    Read as every JSON from a client is (:func:`~omni_trio.serve.json_body.parse_json`: deep nesting is
    a bad event too, not a crash).
    """
    try:
        data = parse_json(text)
    except InvalidJSON as exc:
        raise BadEvent(f"the message: {str(exc)[:200]}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise BadEvent(f"an event must be a JSON object, got {type(data).__name__}", code="invalid_event")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    if not isinstance(data.get("type"), str):
        raise BadEvent("the event has no string 'type'", param="type", event_id=event_id)
    return data


def dumps(event: dict[str, Any]) -> str:
    """An event as compact JSON."""
    return json.dumps(event, separators=(",", ":"))
