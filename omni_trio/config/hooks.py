"""Hooks named by dotted path: a callable stored as its path, a path imported, and what can go wrong.

Config fields that name user code (factories, routing and merge hooks, adapters)
hold dotted paths (``"pkg.module.attr"``) so that a config can cross into worker
processes; :func:`import_string` turns one back into the object.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

from omni_trio.errors import ConfigProblem

__all__ = [
    "did_you_mean",
    "dotted_path",
    "factory_kwarg_problems",
    "hook_path_problems",
    "import_problem",
    "import_string",
    "scheduler_option_problems",
]

#: Options of the built-in schedulers that a stage's factory passes on by name: the smallest value each
#: takes, whether None (no bound) is allowed, and whether it is a whole number. Their ranges are checked
#: in the config, so that ``max_batch_size=0`` is a problem listed at validation, not a stage that fails.
SCHEDULER_OPTIONS: dict[str, tuple[int, bool, bool]] = {
    "max_batch_size": (1, False, True),
    "max_batch_wait_ms": (0, False, False),
    "max_batch_cost": (1, True, True),
    "max_concurrency": (1, True, True),
    "max_pending": (1, True, True),
    "max_queued_streams": (1, True, True),
    "max_open_sessions": (1, False, True),
    "max_state_bytes_per_session": (1, False, True),
}


def dotted_path(value: Any) -> Any:
    """Store a module-level callable as its dotted path; leave anything else as is."""
    if callable(value) and not isinstance(value, str):
        module = getattr(value, "__module__", None)
        qualname = getattr(value, "__qualname__", "")
        if module is None or "<" in qualname:
            # Validation reports it with its path; a lambda or closure cannot be
            # imported in another process.
            return value
        return f"{module}.{qualname}"
    return value


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def hook_path_problems(path: str, value: object, process: str | None = None) -> list[ConfigProblem]:
    """The problem of hook ``value`` at ``path`` if it is neither None nor a dotted path, or if it names
    the ``__main__`` script while it runs in worker ``process`` (None: in the caller's process)."""
    if isinstance(value, str) and value.startswith("__main__.") and process is not None:
        # A worker's __main__ is not the caller's script: the import would fail in every worker.
        return [ConfigProblem(path, f"{value!r} is defined in the __main__ script, which worker process "
                                    f"{process!r} cannot import: define it in an importable module")]
    if value is None or (isinstance(value, str) and value.count(".") >= 1 and all(value.split("."))):
        return []
    if callable(value):
        return [
            ConfigProblem(path, f"{value!r} cannot be imported by name; use a module-level function or a dotted path")
        ]
    return [ConfigProblem(path, f"expected a dotted path 'package.module.attr', got {value!r}")]


def import_string(path: str) -> Any:
    """Import ``"package.module.attr"`` (nested attributes allowed) and return the object."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for depth, attr in enumerate(parts[split:]):
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                owner = ".".join(parts[: split + depth])
                known = [name for name in dir(obj) if not name.startswith("_")]
                raise AttributeError(f"{owner!r} has no attribute {attr!r}{did_you_mean(attr, known)}") from None
        return obj
    raise ImportError(f"no module found for {path!r}")


def import_problem(path: str, value: str) -> tuple[Any, ConfigProblem | None]:
    """Import callable ``value`` (the config field at ``path``): the object, or the problem why not."""
    try:
        obj = import_string(value)
    except Exception as exc:  # noqa: BLE001 - every import failure is reported, with its path
        return None, ConfigProblem(path, f"cannot import {value!r}: {type(exc).__name__}: {exc}")
    if not callable(obj):
        return None, ConfigProblem(path, f"{value!r} is not callable")
    return obj, None


def factory_kwarg_problems(path: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> list[ConfigProblem]:
    """Problems with passing ``kwargs`` to ``factory`` (names its signature cannot accept)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return []
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return []
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return [
        ConfigProblem(f"{path}[{key!r}]", f"the factory does not accept {key!r}{did_you_mean(key, accepted)}")
        for key in kwargs
        if key not in accepted
    ]


def scheduler_option_problems(path: str, kwargs: object) -> list[ConfigProblem]:
    """The factory kwargs (the ``factory`` dict at ``path``) that name a scheduler option with a value out
    of its range (:data:`SCHEDULER_OPTIONS`)."""
    if not isinstance(kwargs, dict):
        return []
    problems = []
    for key, value in kwargs.items():
        if key not in SCHEDULER_OPTIONS or (value is None and SCHEDULER_OPTIONS[key][1]):
            continue
        least, none_ok, whole = SCHEDULER_OPTIONS[key]
        kinds = (int,) if whole else (int, float)
        if isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value) and value >= least:
            continue
        expected = f"{'a whole number' if whole else 'a number'} >= {least}"
        problems.append(ConfigProblem(f"{path}[{key!r}]", f"{key} must be {'None or ' * none_ok}{expected}, "
                                                          f"got {value!r}"))
    return problems
