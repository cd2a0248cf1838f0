"""Routing decisions compiled once per stage: where a result goes, and how.

``compile_routing`` turns a :class:`~omni_trio.config.StageConfig` into
plain callables so the hot path never re-reads the config or re-imports a
hook. Every hook error surfaces as :class:`RoutingError` with a message that
names the hook, which the stage turns into a failure of that one request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from omni_trio.config import StageConfig
from omni_trio.config.hooks import import_string
from omni_trio.payload import StagePayload


class RoutingError(Exception):
    """A routing hook returned something the stage cannot route."""


GetNext = Callable[[str, Any], "str | list[str] | None"]
StreamDoneTargets = Callable[[str, Any], list[str]]


def normalize_targets(value: object, *, allowed: list[str], hook: str, allow_empty: bool) -> list[str]:
    """Turn a hook's answer (a name or a list of names) into a checked list."""
    if value is None:
        targets: list[str] = []
    elif isinstance(value, str):
        targets = [value]
    elif isinstance(value, (list, tuple)):
        targets = list(value)
    else:
        raise RoutingError(f"{hook} must return a stage name or a list of names, got {type(value).__name__}")
    if not targets and not allow_empty:
        raise RoutingError(f"{hook} returned no stages; dynamic route functions must return downstream stage(s)")
    outside = [t for t in targets if not isinstance(t, str) or t not in allowed]
    if outside:
        raise RoutingError(f"{hook} returned {outside!r}, outside the allowed stages {sorted(allowed)!r}")
    return targets


def _compile_get_next(config: StageConfig) -> GetNext:
    if config.terminal:
        return lambda request_id, output: None
    allowed = config.next_stages
    if config.route_fn is not None:
        route_fn = import_string(config.route_fn)

        def get_next(request_id: str, output: Any) -> str | list[str]:
            answer = route_fn(request_id, output)
            targets = normalize_targets(answer, allowed=allowed, hook="route_fn", allow_empty=False)
            return answer if isinstance(answer, str) else targets

        return get_next
    static = config.next
    if isinstance(static, str):
        return lambda request_id, output: static
    return lambda request_id, output: list(allowed)


def _compile_stream_done_targets(config: StageConfig) -> StreamDoneTargets:
    stream_to = list(config.stream_to)
    if config.stream_done_to_fn is None:
        return lambda request_id, output: stream_to
    hook = import_string(config.stream_done_to_fn)
    return lambda request_id, output: normalize_targets(
        hook(request_id, output), allowed=stream_to, hook="stream_done_to_fn", allow_empty=True
    )


@attrs.frozen
class CompiledRouting:
    """A stage's routing, compiled from its config."""

    get_next: GetNext
    stream_done_targets: StreamDoneTargets
    projectors: dict[str, Callable[[StagePayload], StagePayload]]
    stream_to: list[str]
    terminal: bool


def compile_routing(config: StageConfig) -> CompiledRouting:
    """Import ``config``'s hooks and build its routing callables."""
    return CompiledRouting(
        get_next=_compile_get_next(config),
        stream_done_targets=_compile_stream_done_targets(config),
        projectors={target: import_string(path) for target, path in config.project_payload.items()},
        stream_to=list(config.stream_to),
        terminal=config.terminal,
    )


_MUTABLE_CONTAINERS = (dict, list, set, bytearray)


def _mutable_containers(root: object) -> set[int]:
    """ids of every dict/list/set/bytearray reachable from ``root`` (cycle-safe)."""
    found: set[int] = set()
    stack = [root]
    seen: set[int] = set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _MUTABLE_CONTAINERS):
            found.add(id(obj))
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
    return found


def is_isolated_projection(original: object, projected: object, *, has_projector: bool) -> bool:
    """Whether a fan-out projection shares no mutable container with the original.

    Only then may a same-process target receive the projected object itself;
    otherwise two stages would mutate the same list. Tensors may be shared:
    stages treat received tensors as read-only.
    """
    if not has_projector or projected is original:
        return False
    if not isinstance(original, StagePayload) or not isinstance(projected, StagePayload):
        raise RoutingError(
            f"project_payload must return a StagePayload, got {type(projected).__name__}"
        )
    if projected.data is original.data:
        return False
    return not (_mutable_containers(original.data) & _mutable_containers(projected.data))
