"""What a worker process is told: its :class:`WorkerSpec`, and where it reports a failed start-up.

The supervisor writes the spec (or a joined worker receives it, :mod:`omni_trio.runtime.remote.worker_join`);
the worker (:mod:`omni_trio.runtime.workers.worker`) reads it and, if it cannot start, leaves its traceback at
:func:`startup_traceback_path`, where the supervisor looks for it.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from omni_trio.config import PipelineConfig
from omni_trio.control.wire.curve import CurveKeys


@attrs.frozen
class WorkerSpec:
    """Everything a worker needs, written by the runtime into the private IPC directory."""

    config: PipelineConfig
    process: str
    ipc_dir: str
    shm_prefix: str
    #: The run's secret: every message carries its proof (omni_trio/control/wire/auth.py).
    secret: bytes
    trace_path: str | None
    sys_path: list[str]
    #: Requests failed when an earlier incarnation of this process died: messages for
    #: them still queued towards its socket must be dropped by the new one.
    retired: list[str] = attrs.field(factory=list)
    #: The run's CURVE keys, for a process with ``tcp://`` sockets (omni_trio/control/wire/curve.py).
    curve: CurveKeys | None = None
    #: Peers on other hosts: their ``tcp://`` control endpoints.
    tcp: dict[str, str] = attrs.field(factory=dict)
    #: Joined over TCP (``manual``): no parent process, no pipe to watch.
    joined: bool = False
    #: A local worker with an edge to or from a process that joined over TCP: where it also receives
    #: over TCP (CURVE, with ``curve``): ``tcp://HOST:*`` at first (the port it got is in its Ready),
    #: the same port again when it is restarted (its peers' connections find it there).
    listen: str | None = None


def startup_traceback_path(ipc_dir: Path, process: str) -> Path:
    """Where a worker that failed to start leaves its traceback."""
    return ipc_dir / f"{process}.traceback"
