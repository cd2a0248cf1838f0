"""Where a request goes and which stages' completions resolve it.

An ordinary request enters at the entry stage and is resolved by the terminal stages
(``terminal_stages_fn``, when the config names one, picks a subset per request); a session's
operation goes to its session's owner stages (:func:`~omni_trio.coordinator.sessions.session_targets`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni_trio.config import PipelineConfig
from omni_trio.config.hooks import import_string
from omni_trio.coordinator.sessions import session_targets
from omni_trio.payload import OmniRequest
from omni_trio.scheduling.session_operation import SessionOperation


def make_request(inputs: Any, params: dict[str, Any] | None, metadata: dict[str, Any] | None) -> OmniRequest:
    """The request the caller means: ``inputs`` itself when it is an :class:`OmniRequest` (which then
    carries its own params and metadata), else one built from the three."""
    if isinstance(inputs, OmniRequest):
        if params is not None or metadata is not None:
            raise ValueError("pass params and metadata inside the OmniRequest, not beside it")
        return inputs
    return OmniRequest(inputs, dict(params or {}), dict(metadata or {}))


class RequestTargets:
    """The stages of a pipeline that a request is submitted to and resolved by."""

    def __init__(self, config: PipelineConfig) -> None:
        self._entry = config.entry
        self._stage_names = frozenset(stage.name for stage in config.stages)
        self._replicated = frozenset(stage.name for stage in config.stages if stage.replicas > 1)
        self._terminals = frozenset(config.terminal_stages)
        self._terminals_fn: Callable[[OmniRequest], Any] | None = (
            None if config.terminal_stages_fn is None else import_string(config.terminal_stages_fn)
        )

    def of(self, request: OmniRequest, session: SessionOperation | None) -> tuple[tuple[str, ...], frozenset[str]]:
        """``(stages the request is submitted to, stages whose completion resolves it)``; raises
        ``ValueError`` for a session operation on stages that cannot own one, or a
        ``terminal_stages_fn`` answer that names no terminal stage."""
        if session is not None:
            entry_stages, completing = session_targets(session, self._stage_names, self._replicated)
            return entry_stages, frozenset(completing)
        return (self._entry,), self._expected_terminals(request)

    def _expected_terminals(self, request: OmniRequest) -> frozenset[str]:
        if self._terminals_fn is None:
            return self._terminals
        answer = self._terminals_fn(request)
        if answer is None:
            return self._terminals
        chosen = frozenset([answer] if isinstance(answer, str) else answer)
        if not chosen or not chosen <= self._terminals:
            raise ValueError(
                f"terminal_stages_fn returned {sorted(chosen)!r}; it must be a non-empty subset of "
                f"the terminal stages {sorted(self._terminals)!r}"
            )
        return chosen
