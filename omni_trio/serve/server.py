"""The OpenAI app on hypercorn's trio worker, inside the caller's trio loop (``ot.serve_http`` runs it)."""

from __future__ import annotations

import functools
import logging

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omni_trio.config import PipelineConfig, ServeConfig
from omni_trio.config.hooks import import_string
from omni_trio.coordinator.pipeline import Pipeline
from omni_trio.errors import ConfigError, ConfigProblem
from omni_trio.serve.adapter import ServeAdapter
from omni_trio.serve.address import ListenError, ServerAddress
from omni_trio.serve.app import OpenAIApp
from omni_trio.serve.limits import SocketLimits
from omni_trio.serve.metrics import Metrics


def serve_config_of(config: PipelineConfig | ServeConfig) -> ServeConfig:
    """The ``serve`` table of a pipeline config (or the ServeConfig itself); ConfigError if there is none."""
    if isinstance(config, ServeConfig):
        return config
    if config.serve is None:
        raise ConfigError([ConfigProblem("serve", "the config has no serve table (model, adapter)")])
    return config.serve


def build_adapter(config: ServeConfig) -> ServeAdapter:
    """The adapter ``config`` names, built with its options; ConfigError if that fails."""
    try:
        adapter = import_string(config.adapter)(**config.adapter_options)
    except Exception as exc:  # the user's constructor: any failure is the config's problem
        problem = ConfigProblem("serve.adapter_options", f"{config.adapter}(**adapter_options) failed: "
                                f"{type(exc).__name__}: {exc}")
        raise ConfigError([problem]) from exc
    if not isinstance(adapter, ServeAdapter):
        raise ConfigError([ConfigProblem("serve.adapter", f"{config.adapter!r} is not a ServeAdapter subclass")])
    return adapter


def _socket_error(error: BaseException) -> OSError | None:
    """The one OSError that ``error`` is or wraps (hypercorn's nurseries wrap it), else None.

    Before hypercorn reports its binds, an OSError can only come from making its listening sockets."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, OSError) else None


class ShieldedResponseEnd:
    """The app, with the last message of each HTTP response sent shielded from cancellation.

    hypercorn re-arms a connection's keep-alive timer (or, once shutting down,
    closes the connection) inside the ``send`` of a response's last body
    message. A ``StreamingResponse`` that ends is cancelled during that very
    ``send``: the disconnect message hypercorn queues there wakes Starlette's
    disconnect listener, which cancels the response's task group. The
    connection was then left idle with no timer: it stayed open until the
    client closed it, and a shutdown waited the whole grace period for it.
    hypercorn itself shields its socket writes; this shields the rest of that
    bookkeeping.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a ``send`` that finishes a response's last message whatever is cancelled."""

        async def send_shielding_the_end(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await self._app(scope, receive, send_shielding_the_end)


async def run_server(
    pipeline: Pipeline,
    config: PipelineConfig | ServeConfig,
    host: str,
    port: int,
    shutdown: trio.Event | None,
    task_status: trio.TaskStatus[ServerAddress],
    limits: SocketLimits,
) -> None:
    """What :func:`omni_trio.serve_http` does (imported only when a server starts)."""
    serve_config = serve_config_of(config)
    app = OpenAIApp(pipeline, serve_config, build_adapter(serve_config), Metrics(serve_config.model), limits)
    hypercorn = HypercornConfig()
    hypercorn.bind = [ServerAddress(host, port).url.removeprefix("http://")]
    hypercorn.graceful_timeout = float(serve_config.grace_period_s)
    hypercorn.accesslog = None
    hypercorn.websocket_max_message_size = limits.max_message_bytes
    # hypercorn's startup banner would go to stderr; the CLI prints its own line.
    hypercorn.loglevel = "WARNING"
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)

    async def until_shutdown() -> None:
        if shutdown is None:
            await trio.sleep_forever()
        else:
            await shutdown.wait()

    address: ServerAddress | None = None
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(hypercorn_serve, ShieldedResponseEnd(app.asgi), hypercorn,  # type: ignore[arg-type]
                                  shutdown_trigger=until_shutdown)
            )
            address = ServerAddress(host, int(binds[0].rsplit(":", 1)[1]))
            task_status.started(address)
    except (OSError, BaseExceptionGroup) as error:
        # Raised out here, not in the nursery: the caller's nursery.start gets the ListenError itself.
        cause = None if address is not None else _socket_error(error)
        if cause is None:
            raise
        where = hypercorn.bind[0]
        raise ListenError(cause.errno, f"cannot listen on {where}: {cause.strerror or cause}") from cause
