"""The ``manual`` launcher: a worker started by hand joins its run over authenticated TCP.

For each process group with ``launcher = "manual"`` (each replica ``p@rK`` of a replicated one) the
runner writes a key file ``<run dir>/<process>.key`` (JSON, mode 0600): the run's CURVE key pair and
secret, the caller's join address ``tcp://HOST:PORT``, the process's name and the host it binds on.
Whoever starts the worker copies it to that host and runs::

    omni-trio worker --join tcp://HOST:PORT --key KEYFILE

The worker binds its control socket at ``tcp://<its host>:*`` (CURVE server, the run's key only),
connects to the caller with the run's keys and sends :class:`~omni_trio.control.wire.messages.Join`
(its name, where it receives, its pid). The caller answers with the worker's spec
(:class:`~omni_trio.control.wire.messages.JoinSpec`) over that authenticated connection; from there the
worker starts like a local one and reports ``Ready`` within the pipeline's start-up timeout.

The caller keeps a connection of its own to each joined worker, with ZMTP heartbeats, and watches it
with a socket monitor: the worker is dead when it drops (a killed process's socket closes at once;
a host that is gone stops answering heartbeats within
:data:`~omni_trio.control.sockets.zmq_sockets.HEARTBEAT_TIMEOUT_MS`).
:class:`RemoteProcess` stands for such a worker where the supervisor expects a process.

A restarted group's worker (``restart="on-failure"``: the same command, run again by an orchestrator)
joins as a new *incarnation*, reaching the caller at a listener of its own; the old incarnation is
superseded the moment its connection dropped, so nothing it still sends is accepted
(:class:`ManualWorkers`).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from omni_trio.control.endpoint import Endpoint
from omni_trio.control.sockets.base import Inbox
from omni_trio.control.sockets.zmq_sockets import connect_watched, wait_dropped
from omni_trio.control.sockets.zmq_trio import TrioSocket
from omni_trio.control.wire import messages as m
from omni_trio.control.wire.codec import encode
from omni_trio.control.wire.curve import CurveKeys
from omni_trio.tracing.trace import get_logger

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
        #: Set when it joined: supersedes its incarnation, the moment it is gone (nothing of it is accepted after).
        self.on_gone: Callable[[], None] | None = None
        self.pid: int | None = None
        self.returncode: int | None = None
        self.stdin: None = None
        self.joined = trio.Event()
        self._gone = trio.Event()

    @property
    def given_up(self) -> bool:
        """Gone (its connection dropped, or it was given up on): it never joins again."""
        return self._gone.is_set()

    async def wait(self) -> int | None:
        """Until the worker is gone."""
        await self._gone.wait()
        return self.returncode

    def gone(self) -> None:
        """The worker's connection dropped (or it was given up on)."""
        if not self._gone.is_set() and self.on_gone is not None:
            self.on_gone()
        self._gone.set()

    def terminate(self) -> None:
        """Stop waiting for the worker (and kill it where its launcher can: a Ray actor)."""
        if self._on_kill is not None:
            self._on_kill()
        self.gone()

    kill = terminate


@attrs.define(eq=False)
class _Incarnation:
    """One join of a process: the listener it sends to (its own: nothing of it is accepted once it is
    superseded), and the caller's watched connection to it."""

    process: str
    listener: Inbox | None = None
    watch: TrioSocket | None = None
    monitor: TrioSocket | None = None
    current: bool = True


class ManualWorkers:
    """The caller's side of the ``manual`` launcher: key files out, joins in, connections watched.

    Each join is an *incarnation* of its process (numbered from 1): the worker sends everything to
    a listener of its own (:meth:`Endpoint.receive_also`), named in its spec. When its connection
    drops (or it is given up on) the incarnation is superseded at once: what still arrives from it
    is dropped (counted, :attr:`superseded_messages`, which ``stats()`` reports) and its sockets are
    closed, so a worker that lost its connection but lives on (a partition) can never reach the state
    of the next one.
    """

    def __init__(self, endpoint: Endpoint, make_spec: Callable[[str, str], object], key_dir: Path) -> None:
        self._endpoint = endpoint
        #: ``make_spec(process, main) -> WorkerSpec``, ``main`` where the worker reaches the caller
        #: (built when the worker joins: it has the peers' addresses).
        self._make_spec = make_spec
        self._key_dir = key_dir
        self._expected: dict[str, RemoteProcess] = {}
        self._written: set[str] = set()
        self._joins: dict[str, int] = {}
        #: Per process, messages of superseded incarnations dropped.
        self.superseded_messages: dict[str, int] = {}
        self._nursery: trio.Nursery | None = None
        endpoint.on(m.Join, self._on_join)

    def key(self, process: str, host: str) -> KeyFile:
        """What ``process``'s worker needs to join (``host``: where it binds)."""
        curve = self._endpoint.policy.curve
        join = self._endpoint.tcp_address
        assert curve is not None and join is not None, "a remote worker needs the caller's tcp address"
        return KeyFile(
            join=join, process=process, host=host, curve_public=curve.keys.public.decode(),
            curve_secret=curve.keys.secret.decode(), secret=self._endpoint.policy.auth.secret.hex(),
        )

    def expect(
        self, process: str, nursery: trio.Nursery, *, key_file: KeyFile | None = None,
        on_kill: Callable[[], None] | None = None,
    ) -> RemoteProcess:
        """Wait for ``process`` to join (again, after a restart); the stand-in for its process. With
        ``key_file``, write it once (the ``manual`` launcher: a restarted worker uses the same file)
        and log the command that starts the worker."""
        self._nursery = nursery
        if key_file is not None:
            path = self._key_dir / f"{process}.key"
            if process not in self._written:
                key_file.write(path)
                self._written.add(process)
            log.warning(
                "waiting_for_manual_worker", process=process, host=key_file.host, key_file=str(path),
                command=f"omni-trio worker --join {key_file.join} --key {path}",
            )
        remote = self._expected[process] = RemoteProcess(on_kill)
        return remote

    async def _on_join(self, message: m.Join) -> None:
        process = message.process
        remote = self._expected.get(process)
        join = self._endpoint.tcp_address
        # A worker given up on before it joined (its attempt timed out) is not waited for any more.
        if remote is None or remote.joined.is_set() or remote.given_up or join is None or not (
            message.address.startswith("tcp://")
        ):
            log.warning("unexpected_join", process=process)
            return
        remote.pid = message.pid
        number = self._joins[process] = self._joins.get(process, 0) + 1
        incarnation = _Incarnation(process)

        def admit() -> bool:
            if not incarnation.current:
                self._count_superseded(process)
            return incarnation.current

        # Its own listener, on the caller's host (any free port): superseding it closes that door.
        incarnation.listener = self._endpoint.receive_also(f"{join.rsplit(':', 1)[0]}:*", admit)
        self._endpoint.learn_address(process, message.address)
        # A connection of our own to the worker: its drop is the worker's death.
        watch, monitor = connect_watched(self._endpoint.context, message.address, self._endpoint.policy)
        incarnation.watch, incarnation.monitor = watch, monitor
        self._endpoint.adopt(watch)
        self._endpoint.adopt(monitor)
        remote.on_gone = functools.partial(self._supersede, incarnation)
        spec = pickle.dumps(self._make_spec(process, incarnation.listener.source))
        await watch.send_multipart(encode(m.JoinSpec(spec=spec)))
        remote.joined.set()
        log.info(
            "manual_worker_joined", process=process, pid=message.pid, address=message.address, incarnation=number
        )
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, incarnation, remote)

    async def _watch(self, incarnation: _Incarnation, remote: RemoteProcess) -> None:
        """Until the worker's connection drops (or it is given up on, which closes the monitor)."""
        assert incarnation.monitor is not None
        with trio.CancelScope(shield=True):  # ends when the endpoint closes the socket, at the latest
            await wait_dropped(incarnation.monitor)
        if incarnation.current:
            log.info("manual_worker_connection_closed", process=incarnation.process, pid=remote.pid)
        remote.gone()

    def _supersede(self, incarnation: _Incarnation) -> None:
        """Nothing of ``incarnation`` is accepted from now on; its sockets close."""
        if not incarnation.current:
            return
        incarnation.current = False
        listener = incarnation.listener
        if listener is not None and not listener.closed:
            while listener.recv_nowait() is not None:
                self._count_superseded(incarnation.process)
        for sock in (incarnation.listener, incarnation.monitor, incarnation.watch):
            if sock is not None:
                self._endpoint.release(sock)

    def _count_superseded(self, process: str) -> None:
        count = self.superseded_messages[process] = self.superseded_messages.get(process, 0) + 1
        if count & (count - 1) == 0:  # 1st, 2nd, 4th...: a flood must not flood the log
            log.warning("superseded_message_dropped", process=process, dropped=count)
