"""omni-trio: multi-stage, multi-process model-serving pipelines on trio.

Everything users need is importable from here::

    import omni_trio as ot

    config = ot.PipelineConfig(entry_stage="a", stages=[ot.StageConfig(...), ...])
    async with ot.open_pipeline(config) as pipeline:
        result = await pipeline.submit("r0", "hello")

``open_pipeline`` yields a :class:`Pipeline`. Subpackages are part of the public face too:
:mod:`omni_trio.serve` (the HTTP front end, served by :func:`serve_http`), :mod:`omni_trio.testing`
(the pytest plugin), :mod:`omni_trio.scheduling` (the scheduler contract).
"""

import warnings as _warnings
from typing import Any as _Any

from omni_trio import serve as serve  # the subpackage (see the docstring)
from omni_trio.comm.alloc import empty, empty_like
from omni_trio.config import (
    CommConfig,
    EndpointsConfig,
    PipelineConfig,
    ServeConfig,
    StageConfig,
    StreamAdmissionConfig,
    StreamDeliveryConfig,
    load_config,
)
from omni_trio.config.processes import ProcessConfig
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.coordinator.replicas import LeastInFlight, ReplicaLoad, ReplicaPolicy
from omni_trio.coordinator.request_stream import RequestStream
from omni_trio.coordinator.sessions import Session
from omni_trio.coordinator.stats import PipelineHealth, PipelineStats
from omni_trio.errors import (
    ConfigError,
    ConfigProblem,
    DuplicateRequestId,
    MessageTooLarge,
    OmniTrioError,
    PipelineClosed,
    QueueFullError,
    RequestAborted,
    RequestError,
    RequestFailed,
    RequestQueueFull,
    RequestTimeout,
    SessionClosed,
    StageProcessDied,
    StageStartupError,
    StatsTimeout,
    Terminated,
)
from omni_trio.events import CompleteMessage, StreamMessage
from omni_trio.payload import OmniRequest, RoutedPayloads, StagePayload, StreamItem
from omni_trio.runtime.pipeline import open_pipeline
from omni_trio.scheduling import (
    BatchedRequest,
    BusyTime,
    ContinuousBatchingScheduler,
    Inbox,
    IncomingMessage,
    Outbox,
    OutgoingMessage,
    SessionContext,
    SessionScheduler,
    SimpleScheduler,
    StageScheduler,
    StepOutput,
    StreamingSimpleScheduler,
    ThreadedSimpleScheduler,
    TimedChunk,
)
from omni_trio.serve import ServeAdapter, ServerAddress, serve_http
from omni_trio.stage.inputs import AggregatedInput, DirectInput, FanInError
from omni_trio.stage.stats import StageStats
from omni_trio.tracing.trace import read_trace

__all__ = [
    "AggregatedInput",
    "BatchedRequest",
    "BusyTime",
    "CommConfig",
    "CompleteMessage",
    "ConfigError",
    "ConfigProblem",
    "ContinuousBatchingScheduler",
    "DirectInput",
    "DuplicateRequestId",
    "EndpointsConfig",
    "FanInError",
    "Inbox",
    "IncomingMessage",
    "LeastInFlight",
    "MessageTooLarge",
    "OmniRequest",
    "OmniTrioError",
    "Outbox",
    "OutgoingMessage",
    "Pipeline",
    "PipelineClosed",
    "PipelineConfig",
    "PipelineHealth",
    "PipelineStats",
    "ProcessConfig",
    "QueueFullError",
    "ReplicaLoad",
    "ReplicaPolicy",
    "RequestAborted",
    "RequestError",
    "RequestFailed",
    "RequestQueueFull",
    "RequestStream",
    "RequestTimeout",
    "RoutedPayloads",
    "ServeAdapter",
    "ServeConfig",
    "ServerAddress",
    "Session",
    "SessionClosed",
    "SessionContext",
    "SessionScheduler",
    "SimpleScheduler",
    "StageConfig",
    "StagePayload",
    "StageProcessDied",
    "StageScheduler",
    "StageStartupError",
    "StageStats",
    "StatsTimeout",
    "StepOutput",
    "StreamAdmissionConfig",
    "StreamDeliveryConfig",
    "StreamItem",
    "StreamMessage",
    "StreamingSimpleScheduler",
    "Terminated",
    "ThreadedSimpleScheduler",
    "TimedChunk",
    "empty",
    "empty_like",
    "load_config",
    "open_pipeline",
    "read_trace",
    "serve_http",
]


#: Old public names: each still works, with a DeprecationWarning naming its replacement.
_DEPRECATED: dict[str, tuple[_Any, str]] = {
    "Coordinator": (Pipeline, "omni_trio.Coordinator is deprecated: open_pipeline yields an omni_trio.Pipeline"),
}


def __getattr__(name: str) -> _Any:
    if name in _DEPRECATED:
        value, message = _DEPRECATED[name]
        _warnings.warn(message, DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
