"""What one process of a pipeline builds of it: its stages, their links, its endpoint.

The caller's process (:mod:`omni_trio.runtime.pipeline`) and every worker process
(:mod:`omni_trio.runtime.workers.worker`)
assemble their part of the pipeline with these, so both build it the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zmq

from omni_trio.comm.router import TransportLogs
from omni_trio.config import MAIN_PROCESS, PipelineConfig, StageConfig
from omni_trio.config.hooks import import_string
from omni_trio.config.processes import host_of, joins
from omni_trio.config.replicas import addressed_placement, addresses_of
from omni_trio.control.bindings import BindingTable
from omni_trio.control.endpoint import Endpoint
from omni_trio.control.links import RemoteStageLink
from omni_trio.control.sockets.host import HostSockets
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
    """Give each stage of one process a link to every stage: local ones directly, the others
    through the process's endpoint (a replicated one through a :class:`ReplicaLink`).

    Each stage notes its sends in its :class:`TransportLog`: the endpoint's with an endpoint,
    else ``transport_logs``'s (the one the process's coordinator link uses too)."""
    logs = transport_logs or TransportLogs(tracer)
    for stage in stages.values():
        transports = logs.of(stage.name) if endpoint is None else endpoint.transports(stage.address)
        links: dict[str, StageLink] = {name: LocalStageLink(other, transports) for name, other in stages.items()}
        if endpoint is None:
            stage.connect(links, transports=transports)
            continue
        for target in config.stages:
            if target.name in stages:
                continue
            remote = [RemoteStageLink(endpoint, stage.address, a, bindings) for a in addresses_of(config, target.name)]
            if bindings is not None and target.replicas > 1:
                links[target.name] = ReplicaLink(target.name, remote, bindings)
            else:
                links[target.name] = remote[0]
        stage.connect(
            links,
            relay_in_use=functools.partial(endpoint.relay_in_use, stage.address),
            on_retire=functools.partial(endpoint.return_held_credits, stage.address),
            bindings=bindings,
            transports=transports,
            allocator=endpoint.allocator(stage.address),
            on_idle=endpoint.stage_idle,
        )


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
