"""Where a server listens."""

from __future__ import annotations

import attrs


@attrs.frozen
class ServerAddress:
    """The host and port a server is bound to (what ``nursery.start(ot.serve_http, ...)`` returns)."""

    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class ListenError(OSError):
    """The server cannot listen on its address (taken, not this host's, not permitted).

    Raised by ``nursery.start(ot.serve_http, ...)`` before it starts; ``strerror`` says which address
    and why, and ``__cause__`` is the socket's own error.
    """
