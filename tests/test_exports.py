"""The public face, pinned (modelled on trio's test_exports.py): what ``omni_trio`` exports is a deliberate list.

Adding or removing a name from ``omni_trio.__all__`` means editing :data:`EXPECTED` here too (and a
CHANGELOG line); a name that moves or is renamed keeps its old spelling, deprecated (:data:`DEPRECATED`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
import warnings
from pathlib import Path

import pytest

import omni_trio as ot

EXPECTED = {
    "AggregatedInput", "BatchedRequest", "BusyTime", "CommConfig", "CompleteMessage", "ConfigError",
    "ConfigProblem", "ContinuousBatchingScheduler", "DirectInput", "DuplicateRequestId", "EndpointsConfig",
    "FanInError", "Inbox", "IncomingMessage",
    "LeastInFlight", "MessageTooLarge", "OmniRequest", "OmniTrioError", "Outbox", "OutgoingMessage",
    "Pipeline", "PipelineClosed", "PipelineConfig", "PipelineHealth", "PipelineStats", "ProcessConfig",
    "QueueFullError", "ReplicaLoad", "ReplicaPolicy", "RequestAborted", "RequestError", "RequestFailed",
    "RequestQueueFull", "RequestStream", "RequestTimeout", "RoutedPayloads", "ServeAdapter", "ServeConfig",
    "ServerAddress", "Session", "SessionClosed", "SessionContext", "SessionScheduler", "SimpleScheduler",
    "StageConfig", "StagePayload", "StageProcessDied", "StageScheduler", "StageStartupError", "StageStats",
    "StatsTimeout", "StepOutput", "StreamAdmissionConfig", "StreamDeliveryConfig", "StreamItem", "StreamMessage",
    "StreamingSimpleScheduler", "Terminated", "ThreadedSimpleScheduler", "TimedChunk", "empty", "empty_like",
    "load_config",
    "open_pipeline", "read_trace", "serve_http",
}
#: Old public spellings that still resolve, each with a DeprecationWarning, and what they resolve to.
DEPRECATED = {"Coordinator": ot.Pipeline}
#: What the handle ``open_pipeline`` yields offers: nothing the runtime alone may call.
PIPELINE_METHODS = {"submit", "stream", "abort", "session", "stats", "health"}
PIPELINE_DEPRECATED_METHODS = {"live_request_ids"}


def _subpackages() -> set[str]:
    # Folders without an __init__.py (namespace packages) count too: pkgutil does not list them.
    root = Path(ot.__file__).parent
    return {info.name for info in pkgutil.iter_modules(ot.__path__)} | {
        path.name for path in root.iterdir() if path.is_dir() and any(path.glob("*.py"))
    }


def test_all_is_the_pinned_list() -> None:
    assert len(ot.__all__) == len(set(ot.__all__)), "a name is listed twice"
    assert set(ot.__all__) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_export_is_importable_and_documented(name: str) -> None:
    value = getattr(ot, name)
    assert importlib.import_module("omni_trio").__dict__[name] is value
    assert not isinstance(value, types.ModuleType), f"{name} is a module; subpackages are not listed in __all__"
    assert inspect.getdoc(value), f"ot.{name} has no docstring"


def test_nothing_private_leaks() -> None:
    assert [name for name in ot.__all__ if name.startswith("_")] == []
    # Not identifiers: what pytest's assertion rewriting adds to a package it rewrites (the plugin's).
    public = {name for name in dir(ot) if name.isidentifier() and not name.startswith("_")}
    extra = public - set(ot.__all__) - _subpackages() - set(DEPRECATED)
    assert extra == set()


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_deprecated_names_warn_and_resolve(name: str) -> None:
    assert name not in ot.__all__
    with pytest.warns(DeprecationWarning, match=f"omni_trio.{name} is deprecated"):
        value = getattr(ot, name)
    assert value is DEPRECATED[name]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        ot.NoSuchName  # noqa: B018 - the lookup is the test


def test_the_pipeline_handle_offers_only_the_callers_methods() -> None:
    public = {name for name, _ in inspect.getmembers(ot.Pipeline) if not name.startswith("_")}
    assert public == PIPELINE_METHODS | PIPELINE_DEPRECATED_METHODS
    for name in ("on_complete", "on_stream", "retire_unknown", "fail_all", "close"):
        assert not hasattr(ot.Pipeline, name)


def test_serve_is_the_package_and_serve_http_the_function() -> None:
    import omni_trio.serve
    import omni_trio.serve.app

    assert isinstance(ot.serve, types.ModuleType)
    assert ot.serve is omni_trio.serve
    assert ot.serve.app.OpenAIApp is omni_trio.serve.app.OpenAIApp
    assert inspect.iscoroutinefunction(ot.serve_http)
    assert ot.serve_http is omni_trio.serve.serve_http


def test_the_old_serve_spellings_warn_and_run_serve_http() -> None:
    with pytest.warns(DeprecationWarning, match=r"call omni_trio.serve_http"):
        from omni_trio.serve import serve
    assert serve is ot.serve_http
    with pytest.warns(DeprecationWarning, match=r"call omni_trio.serve_http"):
        running = ot.serve(None, None)
    assert inspect.iscoroutine(running) and running.cr_code is ot.serve_http.__code__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # never awaited: closed instead
        running.close()
