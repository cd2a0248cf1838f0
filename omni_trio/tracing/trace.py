"""Structured logs and the request/communication trace, through structlog.

Two outputs, configured here once:

* diagnostics (warnings such as a dropped malformed message) go to stderr
  through :func:`get_logger`; ``OMNI_TRIO_LOG_LEVEL`` sets the level
  (default ``warning``);
* the *trace*: one JSON object per line with ``event``, ``ts_ns``,
  ``process`` and the event's fields, written by a :class:`Tracer` when a
  pipeline is opened with ``trace=path`` or ``OMNI_TRIO_TRACE=path``.
  Worker processes write siblings of that file (``run.<process>.jsonl``);
  :func:`read_trace` merges them in time order.

omni-trio never calls ``structlog.configure``: an application's own
structlog configuration stays untouched.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog

TRACE_ENV = "OMNI_TRIO_TRACE"
LOG_LEVEL_ENV = "OMNI_TRIO_LOG_LEVEL"

_LEVEL = logging.getLevelNamesMapping().get(os.environ.get(LOG_LEVEL_ENV, "warning").upper(), logging.WARNING)
_FILTERING = structlog.make_filtering_bound_logger(_LEVEL)


def _json_default(value: Any) -> str:
    return repr(value)


def _dumps(obj: Any, **_kwargs: Any) -> str:
    # JSONRenderer passes its own ``default``; ours stringifies any value.
    return json.dumps(obj, default=_json_default, separators=(",", ":"))


def get_logger(name: str) -> Any:
    """A structlog logger for diagnostics, writing to stderr at ``OMNI_TRIO_LOG_LEVEL``."""
    return structlog.wrap_logger(
        structlog.WriteLogger(sys.stderr),  # one write per line: workers share the stderr pipe
        wrapper_class=_FILTERING,
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_name=name,
    )


def _add_timestamp(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event_dict["ts_ns"] = time.time_ns()
    return event_dict


class Tracer:
    """Writes trace events of one process as JSON lines; a no-op when ``path`` is None.

    Hot paths check :attr:`enabled` before building an event's fields.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, process: str, fields: dict[str, Any] | None = None
    ) -> None:
        """``fields`` go into every event (a replica's process adds ``replica``)."""
        self.path = None if path is None else Path(path)
        self.process = process
        self.enabled = self.path is not None
        self._file: IO[str] | None = None
        self._logger: Any = None
        if self.path is not None:
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._logger = structlog.wrap_logger(
                structlog.WriteLogger(self._file),
                wrapper_class=structlog.BoundLogger,
                processors=[_add_timestamp, structlog.processors.JSONRenderer(serializer=_dumps)],
            ).bind(process=process, **(fields or {}))

    def event(self, name: str, **fields: Any) -> None:
        """Record one trace event (``name`` becomes the ``event`` field)."""
        if self._logger is not None:
            self._logger.info(name, **fields)

    def close(self) -> None:
        """Flush and close the trace file."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._logger = None
            self.enabled = False


def trace_path_from_env(explicit: str | os.PathLike[str] | None) -> Path | None:
    """The trace file to use: ``explicit`` if given, else ``$OMNI_TRIO_TRACE``, else None."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get(TRACE_ENV, "").strip()
    return Path(env) if env else None


def process_trace_path(main: Path, process: str) -> Path:
    """The trace file of worker ``process`` next to the pipeline's ``main`` trace file."""
    return main.with_name(f"{main.stem}.{process}{main.suffix or '.jsonl'}")


def trace_files(main: Path) -> list[Path]:
    """The pipeline's trace file and every worker sibling that exists."""
    siblings = sorted(main.parent.glob(f"{main.stem}.*{main.suffix or '.jsonl'}"))
    return [p for p in [main, *siblings] if p.exists()]


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All events of a pipeline's trace, from every process's file, in time order."""
    events: list[dict[str, Any]] = []
    for file in trace_files(Path(path)):
        with open(file, encoding="utf-8") as handle:
            events.extend(json.loads(line) for line in handle if line.strip())
    events.sort(key=lambda event: event.get("ts_ns", 0))
    return events
