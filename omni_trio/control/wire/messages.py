"""Control-plane messages as attrs classes.

Every message class is frozen, registered under a short type tag with
:func:`message`, and encoded/decoded by :mod:`omni_trio.control.wire.codec`.
Constructors validate, so an invalid message fails at the sender, and the
codec's decoder runs the same checks on whatever arrives. Python objects
(payloads, results, chunks) travel as ``data_ref`` maps whose pickled
header the codec never unpickles: the receiving endpoint does, only after
the message's proof of this run was checked (:mod:`omni_trio.control.wire.auth`)
and the message passed validation, on owner-only IPC sockets.

To add a message: define a frozen attrs class deriving from
:class:`ControlMessage`, decorate it with ``@message("tag")``, use only
msgpack-friendly field types (str, int, bool, float, bytes, None, list/tuple
of those, ``dict[str, Any]``), and give optional fields defaults (fields
equal to their default are omitted on the wire).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import attrs

from omni_trio.control.wire import fields
from omni_trio.control.wire.fields import MAX_CHUNKS_PER_MESSAGE

__all__ = [
    "MAX_CHUNKS_PER_MESSAGE",
    "MESSAGE_TYPES",
    "Abort",
    "AbortDone",
    "Complete",
    "ControlMessage",
    "CreditReturn",
    "DataAck",
    "DataReady",
    "HeldReply",
    "HeldReport",
    "HeldRequest",
    "Join",
    "JoinSpec",
    "PeerAddresses",
    "Ready",
    "Shutdown",
    "SlotRelease",
    "StatsReply",
    "StatsRequest",
    "Stream",
    "Submit",
    "message",
]

#: tag -> message class; filled by :func:`message`.
MESSAGE_TYPES: dict[str, type[ControlMessage]] = {}

M = TypeVar("M", bound="type[ControlMessage]")


def message(tag: str) -> Callable[[M], M]:
    """Class decorator registering a message class under ``tag``."""
    if not tag or not tag.isascii() or len(tag) > 32:
        raise ValueError(f"bad message tag {tag!r}")

    def register(cls: M) -> M:
        if tag in MESSAGE_TYPES:
            raise ValueError(f"message tag {tag!r} already used by {MESSAGE_TYPES[tag].__name__}")
        cls.TAG = tag
        MESSAGE_TYPES[tag] = cls
        return cls

    return register


@attrs.frozen
class ControlMessage:
    """Base of every control-plane message."""

    TAG: ClassVar[str] = ""


@message("submit")
@attrs.frozen
class Submit(ControlMessage):
    """Coordinator → entry stage: admit a request. ``data_ref``: its StagePayload (a DataRef map)."""

    request_id: str = attrs.field(validator=fields.nonempty_str)
    to_stage: str = attrs.field(validator=fields.nonempty_str)
    data_ref: dict[str, Any] = attrs.field(validator=fields.exact(dict))
    replica_bindings: dict[str, Any] | None = attrs.field(default=None, validator=fields.opt_bindings)


@message("data_ready")
@attrs.frozen
class DataReady(ControlMessage):
    """Stage → stage: a payload, a stream chunk, or a stream done/error signal.

    Variants: a *signal* has ``is_done`` or ``error`` (never
    both) and neither ``data_ref`` nor ``chunk_id``; anything else carries a
    ``data_ref`` map (a DataRef wire map, see ``omni_trio.comm.dataref``);
    a ``chunk_id`` (>= 0) makes it stream chunks: ``chunk_count`` consecutive
    ones from ``chunk_id`` on, whose data is a list of ``(data, metadata)``
    pairs (a run of small chunks travels as one message).
    """

    request_id: str = attrs.field(validator=fields.nonempty_str)
    from_stage: str = attrs.field(validator=fields.nonempty_str)
    to_stage: str = attrs.field(validator=fields.nonempty_str)
    data_ref: dict[str, Any] | None = attrs.field(default=None, validator=fields.opt_map)
    chunk_id: int | None = attrs.field(default=None, validator=fields.opt_chunk_id)
    chunk_count: int = attrs.field(default=1, validator=fields.chunk_count)
    is_done: bool = attrs.field(default=False, validator=fields.exact(bool))
    error: str | None = attrs.field(default=None, validator=fields.opt_str)
    #: The request's replica binding (docs/design.md, "Replicas"); None in pipelines without replicas.
    replica_bindings: dict[str, Any] | None = attrs.field(default=None, validator=fields.opt_bindings)

    def __attrs_post_init__(self) -> None:
        if self.is_done and self.error is not None:
            raise ValueError("DataReady: is_done and error are mutually exclusive")
        if self.chunk_count != 1 and self.chunk_id is None:
            raise ValueError("DataReady: chunk_count is for stream chunks (a chunk_id) only")
        if self.is_signal:
            if self.data_ref is not None or self.chunk_id is not None:
                raise ValueError("DataReady: a done/error signal carries neither data_ref nor chunk_id")
        elif self.data_ref is None:
            raise ValueError("DataReady: a payload or chunk needs a data_ref map")

    @property
    def is_signal(self) -> bool:
        """True for stream-done and stream-error signals."""
        return self.is_done or self.error is not None

    @property
    def is_chunk(self) -> bool:
        """True for stream chunks (data with a chunk id)."""
        return self.chunk_id is not None


@message("data_ack")
@attrs.frozen
class DataAck(ControlMessage):
    """Receiver → sender: one relay object was read (or failed); free it.

    ``from_stage`` is the acker (data receiver), ``to_stage`` the original
    sender. ``error`` is required iff ``success`` is false. ``credit_held``
    (successful ACKs only): the object went to a stage whose scheduler has
    yet to take it; the sender keeps the transfer's credit until a
    :class:`CreditReturn` for ``object_id`` (or the request's end).
    """

    request_id: str = attrs.field(validator=fields.nonempty_str)
    from_stage: str = attrs.field(validator=fields.nonempty_str)
    to_stage: str = attrs.field(validator=fields.nonempty_str)
    object_id: str = attrs.field(validator=fields.nonempty_str)
    success: bool = attrs.field(validator=fields.exact(bool))
    error: str | None = attrs.field(default=None, validator=fields.opt_str)
    credit_held: bool = attrs.field(default=False, validator=fields.exact(bool))

    def __attrs_post_init__(self) -> None:
        if self.success and self.error is not None:
            raise ValueError("DataAck: a successful ACK carries no error")
        if not self.success and not self.error:
            raise ValueError("DataAck: a failure ACK needs an error text")
        if self.credit_held and not self.success:
            raise ValueError("DataAck: only a successful ACK holds the credit")


@message("credit_return")
@attrs.frozen
class CreditReturn(ControlMessage):
    """Receiver → sender: the scheduler took object ``object_id`` (or the receiver dropped it).

    Follows a ``DataAck(credit_held=True)`` for the same object: the sender
    returns the transfer's credit of ``from_stage`` (the receiver) now. One
    for an object the sender does not hold a credit for (already returned,
    the request ended) is ignored.
    """

    request_id: str = attrs.field(validator=fields.nonempty_str)
    from_stage: str = attrs.field(validator=fields.nonempty_str)
    to_stage: str = attrs.field(validator=fields.nonempty_str)
    object_id: str = attrs.field(validator=fields.nonempty_str)


@message("slot_release")
@attrs.frozen
class SlotRelease(ControlMessage):
    """Receiver → sender: no tensor views pooled slot ``shm_name`` under ``lease`` any more.

    Sent once per pooled transfer, when the last tensor the receiver built
    over the slot is released (possibly long after the DataAck, which says
    only whether the read succeeded). ``from_stage`` is the receiver,
    ``to_stage`` the sender whose relay owns the slot. The sender reuses the
    slot once it has both this and a successful ACK; a release for a slot or
    lease it does not know (settled as failed, closed) is ignored.
    """

    from_stage: str = attrs.field(validator=fields.nonempty_str)
    to_stage: str = attrs.field(validator=fields.nonempty_str)
    shm_name: str = attrs.field(validator=fields.nonempty_str)
    lease: int = attrs.field(validator=fields.nonneg_int)


@message("complete")
@attrs.frozen
class Complete(ControlMessage):
    """Stage → coordinator: terminal result (``data_ref``: a DataRef map) or request failure (``error``)."""

    request_id: str = attrs.field(validator=fields.nonempty_str)
    from_stage: str = attrs.field(validator=fields.nonempty_str)
    success: bool = attrs.field(validator=fields.exact(bool))
    error: str | None = attrs.field(default=None, validator=fields.opt_str)
    data_ref: dict[str, Any] | None = attrs.field(default=None, validator=fields.opt_map)
    #: The failure is a refusal for lack of room (a scheduler's ``QueueFullError``): the caller gets a
    #: ``RequestQueueFull``, decided by this flag and never by the error's text.
    refused: bool = attrs.field(default=False, validator=fields.exact(bool))

    def __attrs_post_init__(self) -> None:
        if self.success and (self.error is not None or self.data_ref is None or self.refused):
            raise ValueError("Complete: a successful completion carries a data_ref and no error")
        if not self.success and (not self.error or self.data_ref is not None):
            raise ValueError("Complete: a failure carries an error text and no data_ref")


@message("stream")
@attrs.frozen
class Stream(ControlMessage):
    """Terminal stage → coordinator: partial output for the caller's stream.

    ``chunk_count`` consecutive chunks from ``chunk_id`` on, all of one
    ``modality``; ``data_ref`` (a DataRef map) holds the list of their data.
    """

    request_id: str = attrs.field(validator=fields.nonempty_str)
    from_stage: str = attrs.field(validator=fields.nonempty_str)
    chunk_id: int = attrs.field(validator=fields.nonneg_int)
    data_ref: dict[str, Any] = attrs.field(validator=fields.exact(dict))
    modality: str | None = attrs.field(default=None, validator=fields.opt_str)
    chunk_count: int = attrs.field(default=1, validator=fields.chunk_count)


@message("abort")
@attrs.frozen
class Abort(ControlMessage):
    """Coordinator → worker (point to point): drop everything about these requests, confirm ``token``."""

    request_ids: tuple[str, ...] = attrs.field(converter=fields.str_tuple, validator=fields.nonempty_ids)
    token: int = attrs.field(validator=fields.exact(int))


@message("abort_done")
@attrs.frozen
class AbortDone(ControlMessage):
    """Worker → coordinator: every stage of ``process`` dropped the requests of the Abort ``token``."""

    token: int = attrs.field(validator=fields.exact(int))
    process: str = attrs.field(validator=fields.process_name)


@message("held_report")
@attrs.frozen
class HeldReport(ControlMessage):
    """Worker → coordinator (the abort safety net): the requests the stages of ``process`` hold;
    those the coordinator no longer knows are aborted."""

    process: str = attrs.field(validator=fields.nonempty_str)
    request_ids: tuple[str, ...] = attrs.field(converter=fields.str_tuple)


@message("shutdown")
@attrs.frozen
class Shutdown(ControlMessage):
    """Coordinator → stage: leave the receive loop and stop."""


@message("ready")
@attrs.frozen
class Ready(ControlMessage):
    """Worker process → runner: all its stages are built and listening.

    ``address``: where it also receives over TCP (CURVE; a worker that joined, or a local one with
    an edge to or from one), '' if nowhere.
    """

    process: str = attrs.field(validator=fields.process_name)
    stages: tuple[str, ...] = attrs.field(converter=fields.str_tuple)
    address: str = attrs.field(default="", validator=fields.opt_tcp_address)


@message("peer_addresses")
@attrs.frozen
class PeerAddresses(ControlMessage):
    """Runner → worker, once every worker is ready (and again when one restarted): the ``tcp://``
    addresses of the peers it exchanges messages with over TCP (``{process: address}``). Until it
    arrives, a worker's first message to such a peer waits for it."""

    addresses: dict[str, str] = attrs.field(validator=fields.peer_addresses)


@message("join")
@attrs.frozen
class Join(ControlMessage):
    """A ``manual`` worker → runner, over TCP: ``process`` is here, receiving at ``address``."""

    process: str = attrs.field(validator=fields.process_name)
    address: str = attrs.field(validator=fields.nonempty_str)
    pid: int = attrs.field(validator=fields.nonneg_int)


@message("join_spec")
@attrs.frozen
class JoinSpec(ControlMessage):
    """Runner → a joined ``manual`` worker: its pickled WorkerSpec (opened only after the run's proof)."""

    spec: bytes = attrs.field(validator=fields.exact(bytes))


@message("stats_request")
@attrs.frozen
class StatsRequest(ControlMessage):
    """Runner → worker: send a StatsReply with ``token`` to process ``reply_to`` (one of the run's)."""

    reply_to: str = attrs.field(validator=fields.process_name)
    token: int = attrs.field(validator=fields.exact(int))


@message("stats_reply")
@attrs.frozen
class StatsReply(ControlMessage):
    """Worker → runner: per-stage counters (``{stage: {counter: value}}``).

    ``refused_frames``: messages the worker's sockets refused for want of this run's proof.
    ``refused_connections``: connections the worker's inbox closed for its limits.
    ``undeliverable``: messages the worker dropped because nobody listened at a peer's path.
    """

    token: int = attrs.field(validator=fields.exact(int))
    stages: dict[str, Any] = attrs.field(validator=fields.exact(dict))
    process: str = attrs.field(default="", validator=fields.exact(str))
    refused_frames: int = attrs.field(default=0, validator=fields.nonneg_int)
    undeliverable: int = attrs.field(default=0, validator=fields.nonneg_int)
    refused_connections: int = attrs.field(default=0, validator=fields.nonneg_int)


@message("held_request")
@attrs.frozen
class HeldRequest(ControlMessage):
    """Runner → worker (a worker died): send the main process a HeldReply with ``token``."""

    token: int = attrs.field(validator=fields.exact(int))


@message("held_reply")
@attrs.frozen
class HeldReply(ControlMessage):
    """Worker → runner: the requests the stages of ``process`` hold now."""

    token: int = attrs.field(validator=fields.exact(int))
    process: str = attrs.field(validator=fields.process_name)
    request_ids: tuple[str, ...] = attrs.field(converter=fields.str_tuple)
