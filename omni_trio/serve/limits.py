"""The bounds of the server's WebSocket endpoints (``/v1/realtime``, ``/v1/audio/speech/stream``)."""

from __future__ import annotations

import attrs


@attrs.frozen
class SocketLimits:
    """What one WebSocket client may use.

    ``max_message_bytes`` bounds one message (hypercorn closes the connection
    with code 1009 beyond it); ``max_turn_audio_s`` and ``max_session_audio_s``
    bound the input audio of one turn and of a whole realtime session (beyond
    them appends are refused with an ``error`` event); ``idle_timeout_s`` closes
    a connection that sent nothing for that long (code 1000, after an
    ``error`` event); ``max_realtime_sessions`` bounds the realtime
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
