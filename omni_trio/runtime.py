"""``open_pipeline``: build the stages, place them, run them, tear them down.

Stages with ``process=None`` run inside the caller's process on the
caller's trio loop ("embedded" placement): no child process, no socket.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from omni_trio.comm.router import TransportLog
from omni_trio.config import PipelineConfig, StageConfig, check_imports, import_string
from omni_trio.coordinator import Coordinator
from omni_trio.errors import StageStartupError
from omni_trio.payload import StagePayload
from omni_trio.stage.links import CoordinatorLink, LocalCoordinatorLink, LocalStageLink, StageLink
from omni_trio.stage.stage import Stage, StageStats, describe_error
from omni_trio.tracing import Tracer, trace_path_from_env

#: The process name of stages placed in the caller's process.
MAIN_PROCESS = "main"


def build_scheduler(config: StageConfig, model_path: str | None) -> Any:
    """Call a stage's factory with its ``factory`` kwargs plus the standard values it declares."""
    factory = import_string(config.factory_path)
    kwargs = dict(config.factory)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    injected = {"model_path": model_path, "gpu_id": config.gpu}
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
) -> dict[str, Stage]:
    """Build the stages of one process and connect those that are local to each other."""
    receivers = stream_receivers(config)
    stages = {
        spec.name: Stage(
            spec,
            build_scheduler(spec, config.model_path),
            process=process,
            tracer=tracer,
            coordinator=coordinator,
            stream_receiver=spec.name in receivers,
        )
        for spec in placed
    }
    return stages


def local_links(sender: Stage, stages: dict[str, Stage], tracer: Tracer) -> dict[str, StageLink]:
    """Links from ``sender`` to every stage of its own process."""
    transports = TransportLog(sender.name, tracer)
    return {name: LocalStageLink(stage, transports) for name, stage in stages.items()}


class LocalDirectory:
    """The coordinator's view of stages that run in its own process."""

    def __init__(self, stages: dict[str, Stage]) -> None:
        self._stages = stages

    async def submit(self, stage: str, payload: StagePayload) -> None:
        """Hand a new request to the entry stage."""
        await self._stages[stage].on_submit(payload)

    async def abort(self, request_id: str) -> None:
        """Every stage drops ``request_id``."""
        for stage in self._stages.values():
            stage.on_abort(request_id)

    async def stats(self) -> dict[str, StageStats]:
        """Every stage's counters."""
        return {name: stage.stats() for name, stage in self._stages.items()}


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


@asynccontextmanager
async def _single_errors() -> AsyncIterator[None]:
    """Re-raise a nursery's group of one error as that error.

    Callers of ``open_pipeline`` see their own exception (or the one start-up
    error) as is, not wrapped in an ExceptionGroup by the pipeline's nursery.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


@asynccontextmanager
async def open_pipeline(
    config: PipelineConfig, *, trace: str | os.PathLike[str] | None = None
) -> AsyncIterator[Coordinator]:
    """Start ``config``'s stages and yield the pipeline handle; stop everything on exit.

    ``trace`` (or ``$OMNI_TRIO_TRACE``) names a JSON-lines trace file. On
    exit, requests still running are aborted everywhere, stages drain what
    their schedulers already published, and scheduler threads stop.
    """
    check_imports(config)
    remote = sorted({stage.process for stage in config.stages if stage.process is not None})
    if remote:
        raise NotImplementedError(f"process groups {remote} need the multi-process runtime")
    tracer = Tracer(trace_path_from_env(trace), MAIN_PROCESS)
    try:
        async with _single_errors(), trio.open_nursery() as nursery:
            stages: dict[str, Stage] = {}
            coordinator = Coordinator(config, LocalDirectory(stages), tracer, nursery)
            stages.update(
                build_stages(
                    config,
                    config.stages,
                    process=MAIN_PROCESS,
                    tracer=tracer,
                    coordinator=LocalCoordinatorLink(coordinator),
                )
            )
            for stage in stages.values():
                stage.connect(local_links(stage, stages, tracer))
            try:
                for stage in stages.values():
                    await nursery.start(stage.run)
                yield coordinator
            finally:
                await coordinator.close()
                for stage in stages.values():
                    stage.stop()
    finally:
        tracer.close()
