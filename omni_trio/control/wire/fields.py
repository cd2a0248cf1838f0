"""The checks on the fields of control messages (:mod:`omni_trio.control.wire.messages`), as attrs validators
and converters.

The decoder runs them on whatever arrives, after the frame's proof of the run was checked: types are
compared exactly (a bool is not an int, a subclass of str is not a str), and names that end up in
paths (process names) match a strict pattern, so nothing a peer sends reaches the runtime as a value
of another type than its field says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs

#: Most stream chunks one DataReady or Stream message carries (a scheduler's outbox is drained
#: 64 messages at a time, so a run is never longer).
MAX_CHUNKS_PER_MESSAGE = 64


def nonempty_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A non-empty str."""
    if type(value) is not str or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")


#: A process name (``main``, a worker's process group, a replica's ``group@r1``): it names a socket
#: file in the run's directory, so nothing else (no ``/``, no ``..``) gets through.
_PROCESS_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(?:@r[0-9]{1,6})?")


def process_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A process name (see ``_PROCESS_NAME``)."""
    if type(value) is not str or not _PROCESS_NAME.fullmatch(value):
        raise ValueError(f"{attribute.name} must be a process name, got {str(value)[:80]!r}")


def opt_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A str or None."""
    if value is not None and type(value) is not str:
        raise TypeError(f"{attribute.name} must be a string or None, got {type(value).__name__}")


def opt_map(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A map or None."""
    if value is not None and type(value) is not dict:
        raise TypeError(f"{attribute.name} must be a map or None, got {type(value).__name__}")


def opt_bindings(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A request's replica binding, ``{process group: replica index >= 0}``, or None."""
    if value is None:
        return
    if type(value) is not dict or not all(
        type(group) is str and group and type(index) is int and index >= 0 for group, index in value.items()
    ):
        raise ValueError(f"{attribute.name} must map process groups to replica indexes >= 0, got {value!r}")


def exact(tp: type) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """A validator: a value of exactly type ``tp`` (a bool is not an int)."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not tp:
            raise TypeError(f"{attribute.name} must be {tp.__name__}, got {type(value).__name__}")

    return check


def opt_chunk_id(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """A chunk id (an int >= 0) or None."""
    if value is not None:
        nonneg_int(instance, attribute, value)


def chunk_count(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """How many chunks one message carries: an int in 1..:data:`MAX_CHUNKS_PER_MESSAGE`."""
    if type(value) is not int or not 1 <= value <= MAX_CHUNKS_PER_MESSAGE:
        raise ValueError(f"{attribute.name} must be an int in 1..{MAX_CHUNKS_PER_MESSAGE}, got {value!r}")


def nonneg_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An int >= 0."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def nonempty_ids(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    """Request ids, at least one, none empty."""
    if not value or not all(value):
        raise ValueError(f"{attribute.name} must be non-empty request ids, got {value!r}")


def str_tuple(value: object) -> tuple[str, ...]:
    """Converter: a list or tuple of str as a tuple (anything else raises TypeError)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a tuple (list) of strings, got {type(value).__name__}")
    for item in value:
        if type(item) is not str:
            raise TypeError(f"expected a list of strings, got an item of type {type(item).__name__}")
    return tuple(value)


#: Where a process receives over TCP: ``tcp://HOST:PORT`` (an IPv4 address, ``[IPv6]`` or a host name).
_TCP_ADDRESS = re.compile(r"tcp://(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}")


def opt_tcp_address(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """'' or a ``tcp://HOST:PORT`` address."""
    if type(value) is not str or (value and not _TCP_ADDRESS.fullmatch(value)):
        raise ValueError(f"{attribute.name} must be '' or a tcp://HOST:PORT address, got {str(value)[:80]!r}")


def peer_addresses(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """``{process name: tcp://HOST:PORT}``."""
    if type(value) is not dict:
        raise TypeError(f"{attribute.name} must be a map, got {type(value).__name__}")
    for process, address in value.items():
        if type(process) is not str or not _PROCESS_NAME.fullmatch(process):
            raise ValueError(f"{attribute.name}: keys must be process names, got {str(process)[:80]!r}")
        if type(address) is not str or not _TCP_ADDRESS.fullmatch(address):
            raise ValueError(f"{attribute.name}[{process!r}] must be a tcp://HOST:PORT address, "
                             f"got {str(address)[:80]!r}")
