"""A descriptor kept in reserve for the moment a listener's ``accept`` finds none free.

A process out of descriptors (its own limit, or the system's) cannot accept, so the connections waiting
in a listener's backlog stay there and the listener stays readable: accepting again would fail again,
at once, for ever. Holding one descriptor back lets the listener take the next waiting connection
and close it (refused, counted), then take the reserve again; the Unix inbox
(:mod:`omni_trio.control.sockets.unix_inbox`) and the bulk listener (:mod:`omni_trio.comm.bulk`) do so.
"""

from __future__ import annotations

import errno
import os

__all__ = ["NO_DESCRIPTOR", "open_reserve"]

#: ``accept`` found no free descriptor (this process's, or the system's).
NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def open_reserve() -> int | None:
    """A descriptor held for the moment none is free (None: none is free now either)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
