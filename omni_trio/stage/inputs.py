"""Input handlers: what a stage does with a payload that arrives from upstream.

``DirectInput`` computes every payload; ``AggregatedInput`` (a fan-in,
``wait_for`` + ``merge_fn``) holds payloads per request until every expected
source arrived, then merges them. Errors raise :class:`FanInError`; the stage
turns them into a failure of that one request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from omni_trio.errors import OmniTrioError
from omni_trio.payload import StagePayload


class FanInError(OmniTrioError, ValueError):
    """A fan-in input or hook answer the stage cannot use.

    A ``ValueError``, as the reference's fan-in raises, so its catch sites port.
    """


class InputHandler(Protocol):
    """Turns arrivals into payloads to compute (or ``None`` while waiting)."""

    def receive(self, request_id: str, from_stage: str, payload: StagePayload) -> StagePayload | None:
        """``from_stage``'s payload arrived: the payload to compute, or None while inputs are missing."""

    def cancel(self, request_id: str) -> None:
        """Forget what is held for ``request_id``."""

    def pending_count(self) -> int:
        """How many requests wait for more inputs."""


class DirectInput:
    """Every arrival is computed as is."""

    def receive(self, request_id: str, from_stage: str, payload: StagePayload) -> StagePayload | None:
        """Return ``payload`` unchanged."""
        return payload

    def cancel(self, request_id: str) -> None:
        """Nothing is held per request."""

    def pending_count(self) -> int:
        """Always 0: nothing is held."""
        return 0


ExpectedSourcesFn = Callable[[str, str, StagePayload], "str | Iterable[str] | None"]


class AggregatedInput:
    """Fan-in: collect one payload per expected source, then ``merge`` them.

    ``merge`` receives ``{source name: payload}`` in arrival order and must
    look entries up by name. ``expected_sources_fn`` (a stage's
    ``wait_for_fn``) may narrow the sources per request; it is asked on every
    arrival until it answers.
    """

    def __init__(
        self,
        sources: Iterable[str],
        merge: Callable[[dict[str, StagePayload]], StagePayload],
        expected_sources_fn: ExpectedSourcesFn | None = None,
    ) -> None:
        self.sources = frozenset(sources)
        self.merge = merge
        self.expected_sources_fn = expected_sources_fn
        self.pending: dict[str, dict[str, StagePayload]] = {}
        self.expected: dict[str, frozenset[str]] = {}

    def receive(self, request_id: str, from_stage: str, payload: StagePayload) -> StagePayload | None:
        """Store an arrival; return the merged payload once the fan-in is complete."""
        if from_stage not in self.sources:
            raise FanInError(
                f"fan-in received a payload from {from_stage!r}, which is not in wait_for {sorted(self.sources)}"
            )
        arrivals = self.pending.setdefault(request_id, {})
        if from_stage in arrivals:
            raise FanInError(f"fan-in received a second payload from {from_stage!r} for the same request")
        arrivals[from_stage] = payload
        expected = self.expected.get(request_id)
        if expected is None:
            if self.expected_sources_fn is None:
                expected = self.sources
            else:
                answer = self.expected_sources_fn(request_id, from_stage, payload)
                if answer is None:
                    return None
                expected = self._normalize(answer)
            self.expected[request_id] = expected
        unexpected = set(arrivals) - expected
        if unexpected:
            raise FanInError(
                f"received sources outside expected fan-in: {sorted(unexpected)}; expected {sorted(expected)}"
            )
        if set(arrivals) != expected:
            return None
        inputs = self.pending.pop(request_id)
        del self.expected[request_id]
        return self.merge(inputs)

    def _normalize(self, answer: object) -> frozenset[str]:
        if isinstance(answer, str):
            names: set[Any] = {answer}
        else:
            try:
                names = set(answer)  # type: ignore[call-overload]
            except TypeError:
                raise FanInError(
                    f"wait_for_fn must return a stage name, names or None, got {type(answer).__name__}"
                ) from None
        if not names:
            raise FanInError("wait_for_fn returned no sources")
        if any(not isinstance(name, str) for name in names):
            raise FanInError(f"wait_for_fn returned non-string sources: {sorted(map(repr, names))}")
        outside = names - self.sources
        if outside:
            raise FanInError(f"wait_for_fn returned {sorted(outside)}, outside static wait_for {sorted(self.sources)}")
        return frozenset(names)

    def cancel(self, request_id: str) -> None:
        """Drop everything held for ``request_id``."""
        self.pending.pop(request_id, None)
        self.expected.pop(request_id, None)

    def pending_count(self) -> int:
        """Requests with a partial fan-in held."""
        return len(self.pending)
