"""What a :class:`~omni_trio.scheduling.streaming.StreamingSimpleScheduler` subclass implements:
the hooks, each with a default that does nothing."""

from __future__ import annotations

from omni_trio.payload import StagePayload, StreamItem
from omni_trio.scheduling.protocol import OutgoingMessage


class StreamingHooks:
    """The hooks a streaming stage overrides; the scheduler calls them on its thread."""

    def is_streaming_payload(self, payload: StagePayload) -> bool:
        """Whether ``payload`` starts a streaming request (default: never)."""
        return False

    def validate_non_streaming_payload(self, payload: StagePayload) -> None:
        """Raise to fail a non-streaming request before it is computed."""

    def on_streaming_new_request(self, request_id: str, payload: StagePayload) -> None:
        """A streaming request's payload arrived (it is in :attr:`stream_payloads`)."""

    def on_stream_chunk(self, request_id: str, item: StreamItem) -> list[OutgoingMessage]:
        """Handle one chunk (called under :attr:`state_lock`); return messages to emit."""
        return []

    def on_stream_done(self, request_id: str) -> list[OutgoingMessage] | None:
        """The stream ended and the payload is here: return the completing messages.

        Return ``None`` to finish later through :meth:`complete_stream_request`.
        """
        return []

    def on_stream_done_before_payload(self, request_id: str) -> list[OutgoingMessage]:
        """Output owed the moment the stream ends, before the payload arrived.

        For example an already decoded tail: it must not wait for the payload,
        which travels on another path. Completion still waits for the payload.
        """
        return []

    def clear_stream_state(self, request_id: str) -> None:
        """Drop the subclass's state for ``request_id`` (completion or abort)."""

    def has_ready_work(self) -> bool:
        """True when :meth:`run_ready_step` can compute on already-ingested state."""
        return False

    def run_ready_step(self) -> None:
        """One compute step on already-ingested state; runs when the inbox is empty.

        An exception here is not tied to a request: it ends ``start`` (the
        stage then treats the scheduler as crashed).
        """
