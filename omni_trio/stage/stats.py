"""What a stage counts: :class:`StageStats`, the counters its ``stats()`` reports.

The held-state counters say what a stage still holds of its requests (all zero
when it holds nothing); the cumulative ones are running totals since it started.
"""

from __future__ import annotations

import attrs

#: ``attrs`` metadata key of the :class:`StageStats` fields that are running totals, not held state.
CUMULATIVE = "cumulative"


@attrs.frozen
class StageStats:
    """Counters of one stage; the held-state ones are all zero when no request is in flight.

    ``busy_seconds`` and ``sent_bytes`` are running totals since the stage
    started (a restarted worker's stages start again from zero); see
    docs/serving.md for what they count.
    """

    active_requests: int
    pending_fan_in: int
    request_scopes: int
    in_flight_sends: int
    relay_buffers: int
    queued_inbox: int
    healthy: bool = True
    #: Compute-seconds the scheduler spent in user compute (0 for a scheduler without a :class:`BusyTime`).
    busy_seconds: float = attrs.field(default=0.0, metadata={CUMULATIVE: True})
    #: Tensor bytes sent, ``{receiver: {transport: bytes}}``; the receiver is a stage, a replica's
    #: address (``voc@r1``) or ``"coordinator"`` (the caller); transports as in the trace.
    sent_bytes: dict[str, dict[str, int]] = attrs.field(factory=dict, hash=False, metadata={CUMULATIVE: True})
    #: The stage's process is being restarted: it holds nothing now, and will serve again.
    restarting: bool = False
    #: Computes still running for requests nobody waits for (aborted or failed more than
    #: :data:`~omni_trio.stage.abandoned.STUCK_AFTER_S` ago): request id -> seconds since it was dropped.
    stuck: dict[str, float] = attrs.field(factory=dict)

    @property
    def idle(self) -> bool:
        """True when nothing about any request is held, no compute runs for a dropped request,
        and the stage is not being restarted."""
        return not (
            self.active_requests
            or self.pending_fan_in
            or self.request_scopes
            or self.in_flight_sends
            or self.relay_buffers
            or self.queued_inbox
            or self.stuck
            or self.restarting
        )
