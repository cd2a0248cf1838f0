"""The one way the server reads JSON from a client: :func:`parse_json`.

Every endpoint that takes JSON (HTTP bodies, WebSocket messages) parses it
here, so that every malformed body is the same 400 (:class:`InvalidJSON`),
never a 500. Python's JSON reader recurses once per nesting level: a few
kilobytes of ``[[[[...`` would raise ``RecursionError`` (or, under the limit,
leave a structure deep enough to fail whatever walks it next), so nesting is
bounded at :data:`MAX_DEPTH`, far deeper than any OpenAI body.
"""

from __future__ import annotations

import json
from typing import Any

from omni_trio.serve.schemas import BadRequest

#: The deepest nesting of arrays and objects a client's JSON may have (the document itself is depth 1).
MAX_DEPTH = 64


class InvalidJSON(BadRequest):
    """400: the client's bytes are not a JSON document the server takes; the message says why."""


def _deeper_than(value: Any, limit: int) -> bool:
    # Iterative on purpose: a recursive walk would fail the way the parser does.
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        container, depth = stack.pop()
        if depth > limit:
            return True
        children = container.values() if isinstance(container, dict) else container
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def parse_json(raw: bytes | str) -> Any:
    """``raw`` as a JSON value, or :class:`InvalidJSON` (not UTF-8, not JSON, nested deeper than MAX_DEPTH)."""
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidJSON(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if _deeper_than(value, MAX_DEPTH):
        raise InvalidJSON(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def parse_json_object(raw: bytes | str) -> dict[str, Any]:
    """``raw`` as a JSON object (what every OpenAI request body is), or :class:`InvalidJSON`."""
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise InvalidJSON(f"the body must be a JSON object, got {type(value).__name__}")
    return value
