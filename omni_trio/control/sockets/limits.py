"""What one process's inbox lets the connections to it hold: :class:`InboxLimits`.

Anyone who can reach a run's socket (a same-user process on this host, for the Unix link) can
connect; only the run's processes can seal a message. So a connection is *unproven* until its first
message carrying the run's proof arrives, and what unproven connections and unfinished messages may
hold is capped, so that neither the process's descriptors nor its memory are theirs to take
(docs/reliability.md, "Connections"). The fields mirror :class:`~omni_trio.config.settings.EndpointsConfig`'s.
"""

from __future__ import annotations

import resource

import attrs

from omni_trio.config.settings import EndpointsConfig

__all__ = ["InboxLimits", "inbox_limits"]

#: At most this share of the soft RLIMIT_NOFILE goes to unproven connections: the rest stays for the
#: process's own work (shared memory, files, its peers' links).
_UNPROVEN_SHARE = 4


@attrs.frozen
class InboxLimits:
    """The limits of one process's inbox.

    ``max_unproven_connections``: connections accepted that have not yet delivered a sealed message (a
    newer one evicts the oldest; also at most a quarter of the soft RLIMIT_NOFILE).
    ``proof_timeout_s``: how long a connection may stay unproven before it is closed.
    ``message_timeout_s``: how long a message, once its first bytes arrived, may take to complete.
    ``max_unfinished_bytes``: the bytes of unfinished messages all connections together may hold.
    """

    max_unproven_connections: int = 64
    proof_timeout_s: float = 5.0
    message_timeout_s: float = 30.0
    max_unfinished_bytes: int = 256 << 20

    def unproven_cap(self) -> int:
        """The cap on unproven connections now: the configured one, within a share of the soft RLIMIT_NOFILE."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_unproven_connections
        return max(1, min(self.max_unproven_connections, soft // _UNPROVEN_SHARE))


def inbox_limits(endpoints: EndpointsConfig) -> InboxLimits:
    """The inbox limits a run's ``endpoints`` config sets."""
    return InboxLimits(
        max_unproven_connections=endpoints.max_unproven_connections,
        proof_timeout_s=endpoints.proof_timeout_s,
        message_timeout_s=endpoints.message_timeout_s,
        max_unfinished_bytes=endpoints.max_unfinished_bytes,
    )
