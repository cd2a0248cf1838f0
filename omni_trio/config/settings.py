"""The pipeline-wide settings: its IPC sockets (:class:`EndpointsConfig`), the stream output it buffers for
slow readers (:class:`StreamDeliveryConfig`), and its HTTP front end (:class:`ServeConfig`)."""

from __future__ import annotations

from typing import Any

import attrs

from omni_trio.config.hooks import dotted_path

#: The smallest ``max_message_bytes``: every inline message of the data plane (a pickled object of up
#: to 16 KiB, a run of small stream chunks) must fit.
MIN_MESSAGE_BYTES = 64 * 1024


@attrs.frozen
class EndpointsConfig:
    """The run's IPC sockets: where the per-run IPC directory is created (``None``: the system temp
    dir), and the largest part of a control message they accept (``max_message_bytes``; a bigger one
    is refused by the receiving socket, and the sender fails its request with ``MessageTooLarge``).

    What a process's inbox lets connections hold (whoever can reach its socket can connect; only the
    run's processes can seal a message, which proves a connection): ``max_unproven_connections``
    connections that have not delivered a sealed message yet (a newer one evicts the oldest),
    ``proof_timeout_s`` for a connection to deliver one, ``message_timeout_s`` for a message, once
    begun, to complete, and ``max_unfinished_bytes`` of unfinished messages, all connections together.
    A connection past a limit is closed and counted in ``stats().refused_connections``.
    """

    base_path: str | None = None
    max_message_bytes: int = 64 << 20
    max_unproven_connections: int = 64
    proof_timeout_s: float = 5.0
    message_timeout_s: float = 30.0
    max_unfinished_bytes: int = 256 << 20


@attrs.frozen
class StreamDeliveryConfig:
    """Limits on stream output buffered for callers that read slowly: once the events queued for streaming
    callers and not read yet weigh more than ``max_total_backlog_bytes``, the streams whose readers have
    been idle longest fail with :class:`~omni_trio.RequestQueueFull` (:mod:`omni_trio.coordinator.stream_backlog`)."""

    max_total_backlog_bytes: int = 1 << 30


@attrs.frozen
class ServeConfig:
    """The HTTP front end of a pipeline (``omni-trio serve``, :func:`omni_trio.serve`).

    ``model`` is the model id clients name; ``adapter`` the dotted path of a
    :class:`omni_trio.serve.ServeAdapter` subclass, built with
    ``adapter_options`` as keyword arguments. ``max_body_bytes`` bounds a
    request body (413 beyond it); ``grace_period_s`` is how long in-flight
    requests may finish once the server is asked to stop; ``deadline_s`` is
    the default per-request deadline (504 on expiry; ``None``: none);
    ``retry_after_s`` is the ``Retry-After`` of a 429.
    """

    model: str
    adapter: str = attrs.field(converter=dotted_path)
    adapter_options: dict[str, Any] = attrs.field(factory=dict)
    max_body_bytes: int = 16 << 20
    grace_period_s: float = 10.0
    deadline_s: float | None = None
    retry_after_s: int = 1

