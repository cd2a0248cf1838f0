"""The ``manual`` launcher: a worker started by hand joins its run over authenticated TCP (issue #16).

For each process group with ``launcher = "manual"`` the runner writes a key file (JSON, mode 0600):
the run's CURVE key pair and secret, the caller's join address ``tcp://HOST:PORT``, the group's name
and the host it binds on. Whoever starts the worker copies it to that host and runs::

    omni-trio worker --join tcp://HOST:PORT --key KEYFILE

The worker binds its control socket at ``tcp://<its host>:*`` (CURVE server, the run's key only),
connects to the caller with the run's keys and sends :class:`~omni_trio.control.messages.Join`
(its name, where it receives, its pid). The caller answers with the worker's spec
(:class:`~omni_trio.control.messages.JoinSpec`) over that authenticated connection; from there the
worker starts like a local one and reports ``Ready`` within the pipeline's start-up timeout.

The caller keeps a connection of its own to each joined worker, with ZMTP heartbeats, and watches it
with a socket monitor: the worker is dead when it drops (a killed process's socket closes at once;
a host that is gone stops answering heartbeats within :data:`~omni_trio.control.zmq_trio.HEARTBEAT_TIMEOUT_MS`).
:class:`RemoteProcess` stands for such a worker where the supervisor expects a process.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import attrs
import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from omni_trio.control import messages as m
from omni_trio.control.codec import encode
from omni_trio.control.curve import CurveKeys
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.zmq_trio import TrioSocket, connect_watched_push
from omni_trio.tracing import get_logger

__all__ = ["KeyFile", "ManualWorkers", "RemoteProcess"]

log = get_logger(__name__)


@attrs.frozen(repr=False)
class KeyFile:
    """What a ``manual`` worker needs to join its run (secret: written owner-only, never printed)."""

    join: str
    process: str
    host: str
    curve_public: str
    curve_secret: str
    secret: str

    def __repr__(self) -> str:
        return f"KeyFile(join={self.join!r}, process={self.process!r}, host={self.host!r}, ...)"

    @property
    def curve(self) -> CurveKeys:
        """The run's CURVE key pair."""
        return CurveKeys(public=self.curve_public.encode(), secret=self.curve_secret.encode())

    def write(self, path: Path) -> None:
        """Write the key file, readable by its owner only from the first byte on."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode on O_CREAT
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(attrs.asdict(self), handle)

    @classmethod
    def read(cls, path: Path) -> KeyFile:
        """Read a key file; ValueError saying what is wrong when it is not one."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{field.name: str(data[field.name]) for field in attrs.fields(cls)})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not an omni-trio key file ({type(exc).__name__}: {exc})") from None


class RemoteProcess:
    """A joined ``manual`` worker, where the supervisor expects a :class:`trio.Process`.

    :meth:`wait` returns once the worker's connection dropped after it joined (or :meth:`kill` gave up
    on it); the runtime cannot signal a process on another host, so ``terminate``/``kill`` only stop
    waiting for it (a worker that is still there exits when its connection to the caller drops).
    """

    def __init__(self, on_kill: Callable[[], None] | None = None) -> None:
        self._on_kill = on_kill
        self.pid: int | None = None
        self.returncode: int | None = None
        self.stdin: None = None
        self.joined = trio.Event()
        self._gone = trio.Event()

    async def wait(self) -> int | None:
        """Until the worker is gone."""
        await self._gone.wait()
        return self.returncode

    def gone(self) -> None:
        """The worker's connection dropped."""
        self._gone.set()

    def terminate(self) -> None:
        """Stop waiting for the worker (and kill it where its launcher can: a Ray actor)."""
        if self._on_kill is not None:
            self._on_kill()
        self._gone.set()

    kill = terminate


class ManualWorkers:
    """The caller's side of the ``manual`` launcher: key files out, joins in, connections watched."""

    def __init__(self, endpoint: Endpoint, make_spec: Callable[[str], object], key_dir: Path) -> None:
        self._endpoint = endpoint
        #: ``make_spec(process) -> WorkerSpec`` (built when the worker joins: it has the peers' addresses).
        self._make_spec = make_spec
        self._key_dir = key_dir
        self._expected: dict[str, RemoteProcess] = {}
        self._watches: list[TrioSocket] = []
        self._nursery: trio.Nursery | None = None
        endpoint.on(m.Join, self._on_join)

    def key(self, process: str, host: str) -> KeyFile:
        """What ``process``'s worker needs to join (``host``: where it binds)."""
        curve = self._endpoint.policy.curve
        join = self._endpoint.tcp_endpoint
        assert curve is not None and join is not None, "a remote worker needs the caller's tcp endpoint"
        return KeyFile(
            join=join, process=process, host=host, curve_public=curve.keys.public.decode(),
            curve_secret=curve.keys.secret.decode(), secret=self._endpoint.policy.auth.secret.hex(),
        )

    def expect(
        self, process: str, nursery: trio.Nursery, *, key_file: KeyFile | None = None,
        on_kill: Callable[[], None] | None = None,
    ) -> RemoteProcess:
        """Wait for ``process`` to join; the stand-in for its process. With ``key_file``, write it
        (the ``manual`` launcher) and log the command that starts the worker."""
        self._nursery = nursery
        if key_file is not None:
            path = self._key_dir / f"{process}.key"
            key_file.write(path)
            log.warning(
                "waiting_for_manual_worker", process=process, host=key_file.host, key_file=str(path),
                command=f"omni-trio worker --join {key_file.join} --key {path}",
            )
        remote = self._expected[process] = RemoteProcess(on_kill)
        return remote

    async def _on_join(self, message: m.Join) -> None:
        remote = self._expected.get(message.process)
        if remote is None or remote.joined.is_set() or not message.endpoint.startswith("tcp://"):
            log.warning("unexpected_join", process=message.process)
            return
        remote.pid = message.pid
        self._endpoint.learn_address(message.process, message.endpoint)
        # A connection of our own to the worker: its drop is the worker's death.
        watch, monitor = connect_watched_push(
            self._endpoint.context, message.endpoint, self._endpoint.policy,
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED,
        )
        self._endpoint.adopt(watch)
        self._endpoint.adopt(monitor)
        spec = pickle.dumps(self._make_spec(message.process))
        await watch.send_multipart(encode(m.JoinSpec(spec=spec)))
        remote.joined.set()
        log.info("manual_worker_joined", process=message.process, pid=message.pid, endpoint=message.endpoint)
        assert self._nursery is not None
        self._nursery.start_soon(_watch, monitor, remote)


async def _watch(monitor: TrioSocket, remote: RemoteProcess) -> None:
    with trio.CancelScope(shield=True):  # ends when the endpoint closes the socket
        connected = False
        while True:
            try:
                event = parse_monitor_message(await monitor.recv_multipart())
            except trio.ClosedResourceError:
                return
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                connected = True
            elif event["event"] == zmq.EVENT_DISCONNECTED and connected:
                log.info("manual_worker_connection_closed", pid=remote.pid)
                remote.gone()
                return
