"""What one process of a pipeline builds of it: its stages, their links, its endpoint.

The caller's process (:mod:`omni_trio.runtime.pipeline`) and every worker process
(:mod:`omni_trio.runtime.workers.worker`)
assemble their part of the pipeline with these, so both build it the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq

from omni_trio.comm.router import TransportLog, TransportLogs
from omni_trio.config import MAIN_PROCESS, PipelineConfig, StageConfig
from omni_trio.config.hooks import import_string
from omni_trio.config.processes import host_of, joins
from omni_trio.config.replicas import addressed_placement, addresses_of
from omni_trio.control.bindings import BindingTable
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.links import RemoteStageLink
from omni_trio.control.sockets.host import HostSockets
from omni_trio.control.sockets.limits import inbox_limits
from omni_trio.control.sockets.zmq_trio import SocketPolicy, TrioSocket
from omni_trio.control.wire.auth import FrameMac
from omni_trio.control.wire.curve import Curve, CurveKeys
from omni_trio.errors import StageStartupError, describe_error
from omni_trio.stage.links import CoordinatorLink, LocalStageLink, ReplicaLink, StageLink
from omni_trio.stage.stage import Stage
from omni_trio.tracing.trace import Tracer


def build_scheduler(config: StageConfig, model_path: str | None, replica: int | None = None) -> Any:
    """Call a stage's factory with its ``factory`` kwargs (those of replica ``replica``) plus the
    standard values it declares (``model_path``, ``gpu_id``, ``replica``)."""
    factory = import_string(config.factory_path)
    kwargs = config.factory_kwargs(replica or 0)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    injected = {"model_path": model_path, "gpu_id": config.gpu, "replica": replica or 0}
    for name, value in injected.items():
        if name in params and name not in kwargs:
            kwargs[name] = value
    try:
        return factory(**kwargs)
    except Exception as exc:
        raise StageStartupError(
            f"stage {config.name!r}: factory {config.factory_path} failed: {describe_error(exc)}"
        ) from exc


def stream_receivers(config: PipelineConfig) -> set[str]:
    """Stages that some stage lists in ``stream_to``."""
    return {target for stage in config.stages for target in stage.stream_to}


def build_stages(
    config: PipelineConfig,
    placed: Iterable[StageConfig],
    *,
    process: str,
    tracer: Tracer,
    coordinator: CoordinatorLink,
    replica: int | None = None,
) -> dict[str, Stage]:
    """Build the stages of one process, replica ``replica`` of its group if it is replicated
    (their links come from :func:`connect_stages`)."""
    receivers = stream_receivers(config)
    return {
        spec.name: Stage(
            spec,
            build_scheduler(spec, config.model_path, replica),
            process=process,
            tracer=tracer,
            coordinator=coordinator,
            stream_receiver=spec.name in receivers,
            replica=replica,
        )
        for spec in placed
    }


def connect_stages(
    config: PipelineConfig,
    stages: dict[str, Stage],
    endpoint: Endpoint | None,
    tracer: Tracer,
    bindings: BindingTable | None = None,
    transport_logs: TransportLogs | None = None,
) -> None:
    """Give each stage of one process a link to every stage (:func:`link_to` says which link) and the
    log it notes its sends in: the endpoint's with an endpoint, else ``transport_logs``'s (the one the
    process's coordinator link uses too)."""
    logs = transport_logs or TransportLogs(tracer)
    for stage in stages.values():
        transports = logs.of(stage.name) if endpoint is None else endpoint.transports(stage.address)
        links = {
            target.name: link_to(config, target, stage, stages, endpoint, bindings, transports)
            for target in config.stages
        }
        stage.connect(links, transports, endpoint=endpoint, bindings=bindings)


def link_to(
    config: PipelineConfig,
    target: StageConfig,
    stage: Stage,
    here: dict[str, Stage],
    endpoint: Endpoint | None,
    bindings: BindingTable | None,
    transports: TransportLog,
) -> StageLink:
    """The link ``stage`` sends to ``target`` on, one kind per case:

    * ``target`` runs in this process (``here``): a :class:`LocalStageLink`, which calls it directly;
    * it runs in one other process: a :class:`RemoteStageLink` through this process's endpoint;
    * it runs replicated (``replicas > 1``, with the process's binding table): a :class:`ReplicaLink`
      over one remote link per replica, which sends each request to the replica it is bound to.
    """
    if target.name in here:
        return LocalStageLink(here[target.name], transports)
    if endpoint is None:
        raise ValueError(f"stage {target.name!r} runs in another process, and this one has no endpoint")
    addresses = addresses_of(config, target.name)
    remote = [RemoteStageLink(endpoint, stage.address, address, bindings) for address in addresses]
    if bindings is not None and target.replicas > 1:
        return ReplicaLink(target.name, remote, bindings)
    return remote[0]


def endpoint_for(
    config: PipelineConfig,
    process: str,
    ipc_dir: Path,
    shm_prefix: str,
    tracer: Tracer,
    secret: bytes,
    *,
    curve: CurveKeys | None = None,
    tcp: dict[str, str] | None = None,
    context: zmq.Context[Any] | None = None,
    pull: TrioSocket | None = None,
    policy: SocketPolicy | None = None,
) -> Endpoint:
    """The endpoint of ``process`` in a multi-process run of ``config`` (stages by address: each replica's own).

    ``secret`` is the run's (every message carries its proof, see :mod:`omni_trio.control.wire.auth`);
    ``curve`` its CURVE keys when some process is on another host (:mod:`omni_trio.control.wire.curve`),
    ``tcp`` the peers known to be there; a worker that joined over TCP passes its ``context`` and
    bound ``pull`` socket and the ``policy`` it was built with (:mod:`omni_trio.runtime.remote.worker_join`).
    """
    with_comm = [(a, stage.comm) for stage in config.stages if stage.comm for a in addresses_of(config, stage.name)]
    placement = addressed_placement(config)
    peers = {MAIN_PROCESS, *placement.values()}
    policy = policy or SocketPolicy(
        FrameMac(secret, process=process, tracer=tracer),
        config.endpoints.max_message_bytes,
        None if curve is None else Curve(curve, process=process),
        inbox_limits(config.endpoints),
    )
    return Endpoint(
        process=process,
        sockets=HostSockets(ipc_dir, policy, context),
        placement=placement,
        shm_prefix=shm_prefix,
        tracer=tracer,
        tcp=tcp,
        inbox=pull,
        far=frozenset(peer for peer in peers if host_of(config.processes, peer) != host_of(config.processes, process)),
        # The caller learns each joined worker's address from its Join; a worker, from PeerAddresses.
        tcp_peers=frozenset(
            peer for peer in peers
            if process != MAIN_PROCESS and peer != process and (joins(config.processes, process)
                                                                or joins(config.processes, peer))
        ),
        credits={address: comm.credits for address, comm in with_comm},
        max_transfer_bytes={address: comm.slot_size_mb << 20 for address, comm in with_comm},
        pool_bytes={address: comm.pool_mb << 20 for address, comm in with_comm},
        gpu_stages=frozenset(
            address for stage in config.stages if stage.gpu is not None for address in addresses_of(config, stage.name)
        ),
    )
