"""Per-edge transport choice and its trace.

Each stage owns a :class:`TransportLog` that records, once per edge and
direction and again whenever it changes, which transport an edge uses
(``comm_transport_selected`` in the trace, SPEC §8.10).
"""

from __future__ import annotations

from omni_trio.tracing import Tracer


class TransportLog:
    """Remembers each edge's current transport and traces changes."""

    def __init__(self, stage: str, tracer: Tracer) -> None:
        self._stage = stage
        self._tracer = tracer
        self._chosen: dict[tuple[str, str], str] = {}

    def note(self, direction: str, peer: str, transport: str) -> str:
        """Record that ``direction`` traffic to ``peer`` uses ``transport``; return it."""
        key = (direction, peer)
        previous = self._chosen.get(key)
        if previous != transport:
            self._chosen[key] = transport
            self._tracer.event(
                "comm_transport_selected",
                stage=self._stage,
                direction=direction,
                peer_stage=peer,
                transport=transport,
                previous=previous,
            )
        return transport
