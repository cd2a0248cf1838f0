"""The bounds of the server's WebSocket endpoints (``/v1/realtime``, ``/v1/audio/speech/stream``).

:class:`SocketLimits` lives with the rest of the serve settings
(``ServeConfig.sockets``, ``[serve.sockets]`` in a config file); an explicit
``serve_http(..., limits=)`` takes precedence over it.
"""

from __future__ import annotations

from omni_trio.config import ServeConfig, SocketLimits

__all__ = ["MESSAGE_TOO_BIG", "TRY_AGAIN_LATER", "SocketLimits", "limits_for"]

#: The close code of a connection refused for now (RFC 6455 "try again later").
TRY_AGAIN_LATER = 1013
#: The close code of a message over ``max_message_bytes`` (RFC 6455 "message too big").
MESSAGE_TOO_BIG = 1009


def limits_for(config: ServeConfig, given: SocketLimits | None) -> SocketLimits:
    """The limits a server applies: ``given`` (``serve_http(limits=)``) or else the config's ``sockets``."""
    return config.sockets if given is None else given
