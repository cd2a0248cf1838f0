"""The HTTP front end: an OpenAI-compatible server for a pipeline (see docs/serving.md).

``await nursery.start(ot.serve_http, pipeline, config)`` serves on the caller's trio
loop; ``omni-trio serve CONFIG`` does the same from the command line. The web
stack (Starlette, hypercorn) is imported only when a server starts, so worker
processes never load it.

``omni_trio.serve`` is this package. It was once the function, so calling it
(``ot.serve(pipeline, config)``, ``nursery.start(ot.serve, ...)``) still runs
:func:`serve_http`, with a ``DeprecationWarning``; so does the old name
``omni_trio.serve.serve``.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import trio

from omni_trio.serve.adapter import Completion, Delta, PipelineInput, ServeAdapter
from omni_trio.serve.address import ServerAddress
from omni_trio.serve.audio import decode_wav, pcm16, resample, wav_header
from omni_trio.serve.limits import SocketLimits
from omni_trio.serve.schemas import ChatAudio, ChatMessage, ChatRequest, SpeechRequest

if TYPE_CHECKING:
    from omni_trio.config import PipelineConfig, ServeConfig
    from omni_trio.coordinator.pipeline import Pipeline


async def serve_http(
    pipeline: Pipeline,
    config: PipelineConfig | ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown: trio.Event | None = None,
    limits: SocketLimits | None = None,
    task_status: trio.TaskStatus[ServerAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``pipeline`` over HTTP until cancelled or until ``shutdown`` is set.

    ``config`` is the pipeline's config (its ``serve`` table is used) or a
    :class:`~omni_trio.ServeConfig`. Start it with
    ``address = await nursery.start(ot.serve_http, pipeline, config, host, port)``:
    ``address`` is the bound :class:`ServerAddress` (``port=0`` picks a free port). Once
    ``shutdown`` is set the server stops accepting connections and gives
    requests in flight ``grace_period_s`` to finish; those still running
    then are aborted. Cancelling it aborts them at once. ``limits`` bounds the
    WebSocket endpoints (:class:`SocketLimits`; None: the config's ``serve.sockets``).
    """
    from omni_trio.serve.limits import limits_for
    from omni_trio.serve.server import run_server, serve_config_of

    await run_server(pipeline, config, host, port, shutdown, task_status,
                     limits_for(serve_config_of(config), limits))


__all__ = [
    "ChatAudio",
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "Delta",
    "PipelineInput",
    "ServeAdapter",
    "ServerAddress",
    "SocketLimits",
    "SpeechRequest",
    "decode_wav",
    "pcm16",
    "resample",
    "serve_http",
    "wav_header",
]


_RENAMED = "omni_trio.serve is the serving package; call omni_trio.serve_http(pipeline, config, ...) instead"


def __getattr__(name: str) -> Any:
    # The function's old name inside the package: ``from omni_trio.serve import serve``.
    if name == "serve":
        warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
        return serve_http
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """This package's module type: calling the package runs :func:`serve_http`, deprecated (see the
    module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, None]:
        warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
        return serve_http(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
