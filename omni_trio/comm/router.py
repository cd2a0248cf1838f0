"""Per-edge transport choice and its trace.

Same-process edges are decided by the stage (``local_object`` when the
target may share the object, else ``local_copy``). For an edge to another
process, :func:`choose_transport` picks how one object travels:

* ``inline`` — inside the control message, no relay, no ACK: tensor-free
  objects, and objects whose CPU tensors hold at most 16 KiB (provided
  the pickle stays within 16 KiB too);
* ``shm`` — every other object: CPU tensors of any size (a CPU stream chunk
  over 16 KiB included, where the reference raises), and accelerator
  tensors, copied to host memory. There is no GPU-to-GPU transport: an edge
  between two GPU stages uses ``shm`` too, with a warning, once.

An edge to another host sends what would go through ``shm`` as ``tcp`` frames
instead; the sender knows the host (:mod:`omni_trio.comm.tcp`,
:func:`omni_trio.comm.transfer.encode_object`), this choice does not.

Each stage owns a :class:`TransportLog` that records, once per edge and
direction and again whenever it changes, which transport an edge uses
(``comm_transport_selected`` in the trace), and counts the
tensor bytes sent on each edge by transport (``stats()``'s ``sent_bytes``).
A process keeps its stages' logs in one :class:`TransportLogs`.
"""

from __future__ import annotations

from collections.abc import Iterable

from omni_trio.comm.dataref import TransportKind
from omni_trio.tracing.trace import Tracer, get_logger

log = get_logger(__name__)

#: The sender's name for data the coordinator sends (submitted inputs) and the
#: receiver's name for data sent to it (terminal results, chunks for the caller).
COORDINATOR = "coordinator"

#: Largest tensor data and pickled size sent inside a control message.
INLINE_LIMIT = 16 * 1024


_warned_gpu_fallback: set[tuple[str, str]] = set()


def choose_transport(
    tensor_devices: Iterable[str],
    tensor_bytes: int,
    *,
    sender: str = "",
    receiver: str = "",
    gpu_peers: bool = False,
) -> TransportKind:
    """The transport of one object whose tensors live on ``tensor_devices``.

    ``inline`` is a candidate only: the caller falls back to ``shm`` when
    the pickled object exceeds :data:`INLINE_LIMIT`. ``gpu_peers``: both
    stages are GPU stages (only the one-time warning depends on it).
    """
    devices = set(tensor_devices)
    if not devices:
        return TransportKind.inline
    if devices != {"cpu"} and gpu_peers and (sender, receiver) not in _warned_gpu_fallback:
        _warned_gpu_fallback.add((sender, receiver))
        log.warning(
            "cuda_ipc_unavailable",
            sender=sender,
            receiver=receiver,
            fallback="shm (tensors are copied through host memory)",
        )
    if devices == {"cpu"} and tensor_bytes <= INLINE_LIMIT:
        return TransportKind.inline
    return TransportKind.shm


class TransportLog:
    """Remembers each edge's current transport, traces changes and counts the tensor bytes sent."""

    def __init__(self, stage: str, tracer: Tracer) -> None:
        self._stage = stage
        self._tracer = tracer
        self._chosen: dict[tuple[str, str], str] = {}
        self._bytes: dict[str, dict[str, int]] = {}

    def note(self, direction: str, peer: str, transport: str, nbytes: int = 0) -> str:
        """Record that ``direction`` traffic to ``peer`` uses ``transport`` and carried ``nbytes``
        tensor bytes this time; return the transport."""
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
        by_transport = self._bytes.get(peer)
        if by_transport is None:
            by_transport = self._bytes[peer] = {}
        by_transport[transport] = by_transport.get(transport, 0) + nbytes
        return transport

    def sent_bytes(self) -> dict[str, dict[str, int]]:
        """Tensor bytes sent so far: ``{peer: {transport: bytes}}`` (a copy), every edge used at least once."""
        return {peer: dict(by_transport) for peer, by_transport in self._bytes.items()}


class TransportLogs:
    """The :class:`TransportLog` of every sending stage (or replica address) of one process."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._logs: dict[str, TransportLog] = {}

    def of(self, sender: str) -> TransportLog:
        """``sender``'s log, created on first use."""
        log_ = self._logs.get(sender)
        if log_ is None:
            log_ = self._logs[sender] = TransportLog(sender, self._tracer)
        return log_
