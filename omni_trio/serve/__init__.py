"""The HTTP front end: an OpenAI-compatible server for a pipeline (see docs/serving.md).

``await nursery.start(ot.serve, pipeline, config)`` serves on the caller's trio
loop; ``omni-trio serve CONFIG`` does the same from the command line. The web
stack (Starlette, hypercorn) is imported only when a server starts, so worker
processes never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from omni_trio.serve.adapter import Completion, Delta, PipelineInput, ServeAdapter
from omni_trio.serve.address import ServerAddress
from omni_trio.serve.audio import decode_wav, pcm16, resample, wav_header
from omni_trio.serve.schemas import ChatAudio, ChatMessage, ChatRequest, SpeechRequest

if TYPE_CHECKING:
    from omni_trio.config import PipelineConfig, ServeConfig
    from omni_trio.coordinator.coordinator import Coordinator


async def serve(
    pipeline: Coordinator,
    config: PipelineConfig | ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    shutdown: trio.Event | None = None,
    task_status: trio.TaskStatus[ServerAddress] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``pipeline`` over HTTP until cancelled or until ``shutdown`` is set.

    ``config`` is the pipeline's config (its ``serve`` table is used) or a
    :class:`~omni_trio.ServeConfig`. Start it with
    ``address = await nursery.start(ot.serve, pipeline, config, host, port)``:
    ``address`` is the bound :class:`ServerAddress` (``port=0`` picks a free port). Once
    ``shutdown`` is set the server stops accepting connections and gives
    requests in flight ``grace_period_s`` to finish; those still running
    then are aborted. Cancelling it aborts them at once.
    """
    from omni_trio.serve.server import run_server

    await run_server(pipeline, config, host, port, shutdown, task_status)


__all__ = [
    "ChatAudio",
    "ChatMessage",
    "ChatRequest",
    "Completion",
    "Delta",
    "PipelineInput",
    "ServeAdapter",
    "ServerAddress",
    "SpeechRequest",
    "decode_wav",
    "pcm16",
    "resample",
    "serve",
    "wav_header",
]
