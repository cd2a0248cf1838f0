"""What a pipeline says about itself: :class:`PipelineStats` (``stats()``), :class:`PipelineHealth` (``health()``)."""

from __future__ import annotations

import attrs

from omni_trio.comm.router import COORDINATOR
from omni_trio.config.replicas import logical_name
from omni_trio.stage.stats import StageStats

__all__ = ["PipelineHealth", "PipelineStats"]


@attrs.frozen
class PipelineHealth:
    """Whether every process of a pipeline is alive and ready to take requests.

    ``processes`` maps each process (``"main"`` for the caller's) to
    ``"ready"``, ``"starting"``, ``"restarting"`` or ``"dead"``.
    """

    processes: dict[str, str]

    @property
    def ok(self) -> bool:
        """True when every process is ready."""
        return all(state == "ready" for state in self.processes.values())

    def not_ready(self) -> dict[str, str]:
        """The processes that are not ready, with their state."""
        return {name: state for name, state in self.processes.items() if state != "ready"}


@attrs.frozen
class PipelineStats:
    """Counters of a whole pipeline: per stage, plus requests the coordinator holds."""

    stages: dict[str, StageStats]
    live_requests: int
    rejected_requests: int = 0  # refused at admission by max_in_flight, since the pipeline opened
    #: Streaming requests refused at admission by ``stream_admission`` (the live streams could not take
    #: one more), since the pipeline opened; not counted in ``rejected_requests``.
    refused_streams: int = 0
    #: Replica processes that take no work now (dead, or being restarted).
    down_replicas: tuple[str, ...] = ()
    #: Per process, the messages its sockets refused and dropped undecoded: they lacked this run's
    #: proof (forged, garbage, from another run), and the records of tensors between hosts whose seal
    #: failed (docs/distributed.md); empty when every stage is embedded.
    refused_frames: dict[str, int] = attrs.field(factory=dict)
    #: Per process, the messages it dropped because nobody listened at a same-host peer's path (a
    #: worker that died and was not restarted yet: those messages were for requests that failed with it).
    undeliverable: dict[str, int] = attrs.field(factory=dict)
    #: Per process that joined over TCP (``manual``, ``ray``), the messages that still came from an
    #: incarnation of it the caller had given up (its connection dropped, it was restarted): dropped.
    superseded_messages: dict[str, int] = attrs.field(factory=dict)
    #: Tensor bytes the coordinator sent (submitted inputs), ``{entry stage: {transport: bytes}}``, since
    #: the pipeline opened (the stages' own sends are their :attr:`StageStats.sent_bytes`).
    sent_bytes: dict[str, dict[str, int]] = attrs.field(factory=dict, hash=False)
    #: Bytes of the stream events queued for streaming callers and not read yet, all requests together
    #: (what ``stream_delivery.max_total_backlog_bytes`` caps; see :mod:`omni_trio.coordinator.stream_backlog`).
    stream_backlog_bytes: int = 0
    #: Per process, the connections its inbox (or its listener for tensors between hosts) closed for the
    #: limits of ``endpoints`` (unproven too long or too many, a message unfinished too long or over the
    #: unfinished-bytes cap, no descriptor free); empty when every stage is embedded.
    refused_connections: dict[str, int] = attrs.field(factory=dict)

    @property
    def degraded(self) -> bool:
        """True while a replica is down: the pipeline serves, with fewer replicas."""
        return bool(self.down_replicas)

    @property
    def idle(self) -> bool:
        """True when no request is held anywhere."""
        return self.live_requests == 0 and all(stage.idle for stage in self.stages.values())

    @property
    def busy_seconds(self) -> dict[str, float]:
        """Compute-seconds per stage name, summed over its replicas (see :attr:`StageStats.busy_seconds`)."""
        busy: dict[str, float] = {}
        for address, stage in self.stages.items():
            name = logical_name(address)
            busy[name] = busy.get(name, 0.0) + stage.busy_seconds
        return busy

    @property
    def edge_bytes(self) -> dict[tuple[str, str, str], int]:
        """Tensor bytes per ``(from_stage, to_stage, transport)``, replicas merged into their stage;
        ``"coordinator"`` is the caller's side: ``from_stage`` for submitted inputs, ``to_stage`` for
        results and chunks (see :attr:`StageStats.sent_bytes`)."""
        edges: dict[tuple[str, str, str], int] = {}
        senders = [(COORDINATOR, self.sent_bytes)] + [(a, stage.sent_bytes) for a, stage in self.stages.items()]
        for address, sent in senders:
            for receiver, by_transport in sent.items():
                for transport, nbytes in by_transport.items():
                    key = (logical_name(address), logical_name(receiver), transport)
                    edges[key] = edges.get(key, 0) + nbytes
        return edges

    @property
    def stuck(self) -> dict[str, dict[str, float]]:
        """Stages with computes still running for requests nobody waits for: stage -> its ``StageStats.stuck``."""
        return {name: stage.stuck for name, stage in sorted(self.stages.items()) if stage.stuck}
