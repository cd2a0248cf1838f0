"""Where process groups run: the ``processes`` table of a pipeline config.

``PipelineConfig.processes`` maps a process group's name (a stage's ``process``, or ``"main"`` for
the caller's own process) to a :class:`ProcessConfig`: which launcher starts it and on which host it
lives. A group not listed keeps today's behaviour: a child process of the caller, on its host, over
``ipc://`` sockets and shared memory.

Two processes are on the same host when their ``host`` values are equal; a group without a ``host``
is on the caller's host (``processes["main"].host``). The replicas of a ``manual`` group may each
have a host of their own (``hosts``, one per replica: replica K binds on ``hosts[K]``); each replica
of a ``ray`` group lands where Ray places it. That, not whether ``/dev/shm`` happens to be
reachable, decides the transport of an edge: network namespaces on one machine share ``/dev/shm``
but not their loopback interfaces. Which *socket* carries an edge's messages is decided by the
launchers instead: a process that joined over TCP (``manual``, ``ray``, :func:`joins`) has no socket
in the caller's private directory, so every edge to or from it is a CURVE TCP connection, and a local
worker with such an edge also listens on TCP (:func:`tcp_listeners`).
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from typing import Any

import attrs

from omni_trio.errors import ConfigProblem

__all__ = [
    "DEFAULT_RESTART_BACKOFF_S",
    "LAUNCHERS",
    "RESTART_POLICIES",
    "ProcessConfig",
    "bind_host",
    "host_of",
    "joins",
    "processes_problems",
    "tcp_listeners",
]

#: What may start a process group: a child process here, a Ray actor, or a person / orchestrator.
LAUNCHERS = ("local", "ray", "manual")
#: ``ProcessConfig.restart`` values: a dead worker ends the pipeline, or is started again.
RESTART_POLICIES = ("never", "on-failure")
#: ``ProcessConfig.restart_backoff_s`` by default: the wait before a dead worker's first restart.
DEFAULT_RESTART_BACKOFF_S = 0.1
#: The settings of a process that stages may still carry (deprecated): each moves to the stage's process.
RESTART_FIELDS = ("restart", "max_restarts", "restart_backoff_s")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


@attrs.frozen
class ProcessConfig:
    """One process group's placement.

    ``launcher``: ``"local"`` (a child process of the caller, today's behaviour), ``"manual"``
    (``open_pipeline`` waits for ``omni-trio worker --join ...`` started by hand or by an
    orchestrator) or ``"ray"`` (a Ray actor, :mod:`omni_trio.runtime.remote.ray_launch`). ``host``: the
    address the process binds its control socket on and peers connect to (an IP address or a host
    name, no port); ``None``: the caller's host. ``hosts``: instead of ``host``, one per replica of a
    replicated ``manual`` group (replica K, ``p@rK``, binds on ``hosts[K]``). ``resources`` and
    ``ray_address`` are for the ``ray`` launcher; each replica of a ``ray`` group is an actor of its
    own with those resources, spread over the cluster's nodes where Ray can.

    ``restart`` is the group's policy when its process dies: ``"never"`` (a death ends the pipeline)
    or ``"on-failure"`` (the process is started again, at most ``max_restarts`` times over the
    pipeline's life, the first time after ``restart_backoff_s`` seconds, each further attempt after
    twice the wait of the one before). Of a replicated group, each replica restarts on its own. The
    caller's own process (``"main"``) is never restarted.
    """

    launcher: str = "local"
    host: str | None = None
    hosts: list[str] = attrs.field(factory=list)
    resources: dict[str, float] = attrs.field(factory=dict)
    ray_address: str | None = None
    restart: str = "never"
    max_restarts: int = 3
    restart_backoff_s: float = DEFAULT_RESTART_BACKOFF_S


def host_of(processes: dict[str, ProcessConfig], process: str) -> str | None:
    """The host ``process`` (a group or a replica's name) lives on; None: the caller's, without a TCP address."""
    entry = processes.get(process.split("@r", 1)[0])
    if entry is not None and entry.launcher == "ray":
        # Ray decides where each replica lands: never assumed to share a host (nor /dev/shm) with anyone.
        return f"ray:{process}"
    bound = None if entry is None else bind_host(entry, process)
    if bound is not None:
        return bound
    main = processes.get("main")
    return None if main is None else main.host


def bind_host(entry: ProcessConfig, process: str) -> str | None:
    """Where ``process`` (a group or a replica's name), placed by ``entry``, binds: replica K of a group
    with ``hosts`` on ``hosts[K]``, any other on ``host`` (None: not set)."""
    _, _, replica = process.partition("@r")
    if entry.hosts and replica.isdigit():
        return entry.hosts[int(replica)]
    return entry.host


def _host_problem(at: str, host: object) -> ConfigProblem | None:
    if host is None:
        return None
    if isinstance(host, str):
        try:
            ipaddress.ip_address(host)
            return None
        except ValueError:
            if _HOSTNAME.fullmatch(host):
                return None
    return ConfigProblem(
        at, f"expected an IP address or a host name without scheme or port (e.g. '10.0.0.2'), got {host!r}"
    )


def _entry_problems(at: str, name: str, entry: ProcessConfig, groups: dict[str, dict[str, Any]]) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    launcher = entry.launcher
    if launcher not in LAUNCHERS:
        problems.append(ConfigProblem(f"{at}.launcher", f"expected one of {list(LAUNCHERS)}, got {launcher!r}"))
    host = _host_problem(f"{at}.host", entry.host)
    if host is not None:
        problems.append(host)
    if name == "main" and launcher != "local":
        problems.append(ConfigProblem(f"{at}.launcher", "'main' is the caller's own process: its launcher is 'local'"))
    if name == "main" and entry.restart != "never":
        problems.append(ConfigProblem(f"{at}.restart", "'main' is the caller's own process: it is never restarted"))
    problems += restart_problems(at, entry.restart, entry.max_restarts, entry.restart_backoff_s)
    problems += _hosts_problems(at, entry, groups.get(name, {}).get("replicas", 1))
    if launcher == "manual" and entry.host is None and not entry.hosts:
        problems.append(ConfigProblem(f"{at}.host", "a 'manual' process needs the host it binds on"))
    if launcher == "ray" and entry.host is not None:
        problems.append(ConfigProblem(f"{at}.host", "a 'ray' process binds on the node Ray places it on; remove host"))
    if launcher != "ray":
        for field in ("resources", "ray_address"):
            if getattr(entry, field):
                problems.append(ConfigProblem(f"{at}.{field}", f"{field} is only used by the 'ray' launcher"))
    if not isinstance(entry.resources, dict) or not all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        for k, v in entry.resources.items()
    ):
        problems.append(ConfigProblem(f"{at}.resources", f"expected a table of resource name -> amount > 0, "
                                      f"got {entry.resources!r}"))
    return problems


def _hosts_problems(at: str, entry: ProcessConfig, replicas: int) -> list[ConfigProblem]:
    """The problems of ``entry.hosts`` (one host per replica of a ``manual`` group, instead of ``host``)."""
    hosts = entry.hosts
    if not hosts:
        return []
    if entry.launcher != "manual":
        return [ConfigProblem(f"{at}.hosts", "hosts (one per replica) is only used by the 'manual' launcher")]
    if not isinstance(hosts, (list, tuple)):
        return [ConfigProblem(f"{at}.hosts", f"expected a list of hosts, one per replica, got {hosts!r}")]
    problems = [problem for k, host in enumerate(hosts) if (problem := _host_problem(f"{at}.hosts[{k}]", host))]
    if entry.host is not None:
        problems.append(ConfigProblem(f"{at}.hosts", "set host (every replica's) or hosts (one per replica), not both"))
    if len(hosts) != replicas:
        problems.append(
            ConfigProblem(f"{at}.hosts", f"expected one host per replica ({replicas}), got {len(hosts)}")
        )
    return problems


def restart_problems(at: str, restart: object, max_restarts: object, backoff: object) -> list[ConfigProblem]:
    """The problems of a restart policy (``None``: not set), at ``{at}.restart`` and so on."""
    problems: list[ConfigProblem] = []
    if restart is not None and restart not in RESTART_POLICIES:
        problems.append(ConfigProblem(f"{at}.restart", f"expected one of {list(RESTART_POLICIES)}, got {restart!r}"))
    if max_restarts is not None and not (
        isinstance(max_restarts, int) and not isinstance(max_restarts, bool) and max_restarts >= 0
    ):
        problems.append(ConfigProblem(f"{at}.max_restarts", f"expected a whole number >= 0, got {max_restarts!r}"))
    if backoff is not None and not (
        isinstance(backoff, (int, float)) and not isinstance(backoff, bool) and math.isfinite(backoff) and backoff >= 0
    ):
        problems.append(
            ConfigProblem(f"{at}.restart_backoff_s", f"expected a number of seconds >= 0, got {backoff!r}")
        )
    return problems


def processes_problems(processes: object, groups: dict[str, dict[str, Any]]) -> list[ConfigProblem]:
    """Every problem of a ``processes`` table; ``groups`` maps each process group of the stages to its
    group settings (``replicas``)."""
    if not isinstance(processes, dict):
        return [ConfigProblem("processes", f"expected a table of process name -> ProcessConfig, got {processes!r}")]
    problems: list[ConfigProblem] = []
    known = {"main", *groups}
    for name, entry in processes.items():
        at = f"processes[{name!r}]"
        if name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(ConfigProblem(at, f"{name!r} is not a process of any stage (nor 'main'){hint}"))
            continue
        if not isinstance(entry, ProcessConfig):
            problems.append(ConfigProblem(at, f"expected a ProcessConfig, got {type(entry).__name__}"))
            continue
        problems += _entry_problems(at, name, entry, groups)
    remote = [
        name for name, entry in processes.items()
        if isinstance(entry, ProcessConfig) and (entry.host or entry.hosts or entry.launcher == "ray")
    ]
    main = processes.get("main")
    main_host = main.host if isinstance(main, ProcessConfig) else None
    if remote and main_host is None:
        problems.append(
            ConfigProblem(
                "processes['main'].host",
                f"{remote[0]!r} is on a host of its own, so the caller needs one too: the address it binds on "
                "and workers on other hosts connect to",
            )
        )
    return problems


def joins(processes: dict[str, ProcessConfig], process: str) -> bool:
    """Whether ``process`` (a group or a replica's name) joins the run over TCP (``manual``, ``ray``):
    it has no socket in the caller's private directory, so every peer reaches it over TCP, and it
    reaches every peer but the caller's process at the address the runner sends it (PeerAddresses)."""
    entry = processes.get(process.split("@r", 1)[0])
    return entry is not None and entry.launcher != "local"


def tcp_listeners(processes: dict[str, ProcessConfig], edges: list[tuple[str, str, str, str]]) -> frozenset[str]:
    """The local worker groups that also receive over TCP: those with an edge to or from a group that
    joins over TCP (its messages, and the ACKs of what they send it, arrive there). ``edges`` are
    ``(path, from_process, to_process, to_stage)``; the caller's process always listens on TCP when
    some group joins."""
    return frozenset(
        mine
        for _, source, target, _ in edges
        for mine, other in ((source, target), (target, source))
        if mine != "main" and not joins(processes, mine) and joins(processes, other)
    )
