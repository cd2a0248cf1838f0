"""The pipeline-wide settings: its IPC sockets (:class:`EndpointsConfig`), the stream output it buffers for
slow readers (:class:`StreamDeliveryConfig`), when it refuses new streams (:class:`StreamAdmissionConfig`),
and its HTTP front end (:class:`ServeConfig`, with the bounds of its WebSocket endpoints,
:class:`SocketLimits`)."""

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


#: The ways :class:`StreamAdmissionConfig` may decide.
STREAM_ADMISSION_MODES = ("adaptive", "fixed", "off")


@attrs.frozen
class StreamAdmissionConfig:
    """When a new streaming request is refused (:class:`~omni_trio.QueueFullError`, 429 over HTTP) so that
    the streams already admitted keep playing in real time (:mod:`omni_trio.coordinator.stream_admission`).

    ``mode="adaptive"`` (the default) refuses while an admitted stream is behind its playback deadline:
    its buffered playback is under ``min_slack_s``, or it ran dry (a chunk came more than
    ``stall_tolerance_s`` after the audio before it had played out) less than ``recover_s`` ago. A
    stream's deadline comes from the playback seconds its reader declares (the HTTP server declares
    each audio chunk's), else from its own cadence: its first ``cadence_arrivals`` arrivals set the
    pace, and a chunk later than that pace times ``1 + cadence_tolerance`` is a stall. A stream whose
    deadline is not known yet (no chunk yet, text) never causes a refusal. It also refuses before any
    stream is behind when the pace it measured at the loads it has seen (wall seconds per second of
    declared playback, against the number of live streams) predicts more than ``max_pace`` with one
    more stream. ``mode="fixed"`` refuses
    once ``max_streams`` streams are live; ``mode="off"`` never refuses a stream for its own sake
    (``max_in_flight`` still applies). A session's operations (``pipeline.session``) are never refused
    by it: the session was admitted when it opened.
    """

    mode: str = "adaptive"
    max_streams: int | None = None
    min_slack_s: float = 0.0
    recover_s: float = 1.0
    stall_tolerance_s: float = 0.05
    cadence_arrivals: int = 4
    cadence_tolerance: float = 0.5
    max_pace: float = 0.9


@attrs.frozen
class SocketLimits:
    """What one WebSocket client of the server may use (``[serve.sockets]`` in a config file).

    ``max_message_bytes`` bounds one message (the connection is closed with
    code 1009 beyond it); ``max_turn_audio_s`` and ``max_session_audio_s``
    bound the input audio of one turn and of a whole realtime session (beyond
    them appends are refused with an ``error`` event); ``idle_timeout_s`` closes
    a connection that sent nothing for that long while no answer was under
    way (code 1000, after an ``error`` event); ``max_realtime_sessions`` bounds the realtime
    connections open at once (one more gets an ``error`` event and code 1013,
    "try again later"); ``output_lead_s`` is how far ahead of real time a
    realtime answer's audio is sent, so a barge-in cuts what the listener has
    not heard yet; ``max_text_chars`` bounds the text a speech socket holds
    before it is spoken.
    """

    max_message_bytes: int = 4 << 20
    max_turn_audio_s: float = 120.0
    max_session_audio_s: float = 3600.0
    idle_timeout_s: float = 300.0
    max_realtime_sessions: int = 64
    output_lead_s: float = 1.0
    max_text_chars: int = 256 * 1024


@attrs.frozen
class ServeConfig:
    """The HTTP front end of a pipeline (``omni-trio serve``, :func:`omni_trio.serve`).

    ``model`` is the model id clients name; ``adapter`` the dotted path of a
    :class:`omni_trio.serve.ServeAdapter` subclass, built with
    ``adapter_options`` as keyword arguments. ``max_body_bytes`` bounds a
    request body (413 beyond it); ``grace_period_s`` is how long in-flight
    requests may finish once the server is asked to stop; ``deadline_s`` is
    the default per-request deadline (504 on expiry; ``None``: none);
    ``retry_after_s`` is the ``Retry-After`` of a 429; ``sockets`` bounds the
    WebSocket endpoints (``/v1/realtime``, ``/v1/audio/speech/stream``).
    """

    model: str
    adapter: str = attrs.field(converter=dotted_path)
    adapter_options: dict[str, Any] = attrs.field(factory=dict)
    max_body_bytes: int = 16 << 20
    grace_period_s: float = 10.0
    deadline_s: float | None = None
    retry_after_s: int = 1
    sockets: SocketLimits = attrs.field(factory=SocketLimits)

