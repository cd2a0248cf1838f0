"""How worker processes come to exist: the launcher interface and the local launchers.

The supervisor asks a :class:`Launcher` for one worker process per process
group (and again for each restart); what it gets back behaves like a
``trio.Process`` (:class:`WorkerProcess`). Two launchers run workers on this
host, chosen by ``PipelineConfig.start_method``:

- ``"template"`` (the default), :class:`TemplateLauncher`: one preloaded
  template process per pipeline imports torch, omni_trio and the stage
  modules once and forks every worker, so N workers cost about one import.
  The template is single-threaded, never touches CUDA and creates no zmq
  context; each worker starts its own trio loop and zmq context after the
  fork. If the template cannot fork safely (a stage module started a thread
  or initialised CUDA at import) or dies before it is ready, the pipeline's
  workers are spawned instead and a warning says why; a template that dies
  later is reported and replaced at the next launch.
- ``"spawn"``, :class:`LocalSpawnLauncher`: ``python -m omni_trio.runtime.workers.worker
  SPEC``, a fresh interpreter per worker. Use it where a stage module must
  be imported in every worker process on its own (module-level state set at
  import, such as numpy's global random state, is shared by forked workers).

Either way a worker's stdin is a pipe whose write end the caller holds (EOF:
the pipeline's process is gone), its stdout and stderr are the caller's at
launch, and its death is an awaited event, never a poll.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Protocol

import trio

from omni_trio.config import PipelineConfig
from omni_trio.config.hooks import import_string
from omni_trio.errors import StageStartupError
from omni_trio.runtime.workers.template import TemplateDied, TemplateProcess
from omni_trio.tracing.trace import get_logger

log = get_logger(__name__)

#: Modules every worker imports: the template loads them whatever the stages are.
WORKER_MODULES = ("omni_trio.runtime.workers.worker",)
#: Hooks of a stage whose modules a worker imports too.
_HOOK_FIELDS = ("factory_path", "route_fn", "merge_fn", "wait_for_fn", "stream_done_to_fn", "replica_policy")


class WorkerProcess(Protocol):
    """A started worker process, as the supervisor uses it (``trio.Process`` is one)."""

    @property
    def pid(self) -> int:
        """The process id."""

    @property
    def returncode(self) -> int | None:
        """The exit status once it is known (negative: killed by that signal)."""

    @property
    def stdin(self) -> trio.abc.SendStream | None:
        """The write end of the worker's stdin pipe; closing it tells the worker to exit."""

    async def wait(self) -> int | None:
        """Wait until the process has exited (and is reaped); its exit status."""

    def terminate(self) -> None:
        """Ask the process to exit (SIGTERM)."""

    def kill(self) -> None:
        """Kill the process (SIGKILL)."""


class Launcher(Protocol):
    """Starts worker processes for one pipeline."""

    async def start(self, nursery: trio.Nursery) -> None:
        """Get ready to launch (called once, before the first :meth:`launch`)."""

    async def launch(self, process: str, spec_path: Path) -> WorkerProcess:
        """Start the worker of ``process`` that runs ``python -m omni_trio.runtime.workers.worker spec_path`` would."""

    async def aclose(self) -> None:
        """Release what the launcher holds (after every worker it launched has exited)."""


def worker_command(spec_path: Path) -> list[str]:
    """The command line of a spawned worker (a forked one shows the same in ps)."""
    return [sys.executable, "-m", "omni_trio.runtime.workers.worker", str(spec_path)]


class LocalSpawnLauncher:
    """A fresh interpreter per worker: ``python -m omni_trio.runtime.workers.worker SPEC``."""

    async def start(self, nursery: trio.Nursery) -> None:
        """Nothing to prepare."""

    async def launch(self, process: str, spec_path: Path) -> WorkerProcess:
        """Spawn the worker."""
        return await trio.lowlevel.open_process(worker_command(spec_path), stdin=subprocess.PIPE)

    async def aclose(self) -> None:
        """Nothing to release."""


class TemplateLauncher:
    """Fork workers from one preloaded template process (see the module docstring)."""

    def __init__(self, modules: list[str], *, title_room: int, ready_timeout: float) -> None:
        self._modules = modules
        self._title_room = title_room
        self._ready_timeout = ready_timeout
        self._nursery: trio.Nursery | None = None
        self._template: TemplateProcess | None = None
        #: Set once forking turned out to be unsafe here: the rest of the pipeline's workers are spawned.
        self._spawn: LocalSpawnLauncher | None = None
        self._lock = trio.Lock()

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the template now, so that its imports overlap the rest of the pipeline's start-up."""
        self._nursery = nursery
        await self._open()

    async def launch(self, process: str, spec_path: Path) -> WorkerProcess:
        """Fork the worker from the template (a new template if the last one died)."""
        async with self._lock:
            # Twice at most: a template that died is replaced once per launch.
            for _ in range(2):
                if self._spawn is not None:
                    return await self._spawn.launch(process, spec_path)
                template = await self._usable()
                if template is None:
                    continue
                try:
                    return await template.fork(spec_path)
                except TemplateDied as exc:
                    log.error("launch_template_lost", process=process, error=str(exc))
                    self._template = None
                except RuntimeError as exc:
                    self._use_spawn(str(exc))
            raise StageStartupError(
                f"could not start process {process!r}: its template process died twice while forking it"
            )

    async def aclose(self) -> None:
        """Stop the template."""
        template, self._template = self._template, None
        if template is not None:
            await template.aclose()

    async def _open(self) -> TemplateProcess:
        assert self._nursery is not None, "start() first"
        self._template = await TemplateProcess.open(self._nursery, self._modules, self._title_room)
        return self._template

    async def _usable(self) -> TemplateProcess | None:
        """The template, once it is ready (a new one if it died); None if workers must be spawned."""
        template = self._template
        if template is None or template.dead.is_set():
            template = await self._open()
        with trio.move_on_after(self._ready_timeout):
            problem = await template.wait_ready()
            if problem is None:
                return template
            self._use_spawn(problem)
            await self.aclose()
            return None
        await self.aclose()
        raise StageStartupError(
            f"the template process did not finish importing {self._modules} within {self._ready_timeout:g} s "
            "(does a stage module block at import?)"
        )

    def _use_spawn(self, problem: str) -> None:
        log.warning("launch_template_unusable", problem=problem,
                    effect="this pipeline's workers are spawned (a fresh interpreter each)",
                    hint='set start_method="spawn" to choose that up front')
        self._spawn = LocalSpawnLauncher()


def preload_modules(config: PipelineConfig) -> list[str]:
    """The modules a template imports for ``config``: omni_trio's worker, the worker stages' hooks,
    and torch if this process has imported it (tensors will flow; a worker would import it then)."""
    modules = list(WORKER_MODULES)
    if "torch" in sys.modules:
        modules.insert(0, "torch")
    for stage in config.stages:
        if stage.process is None:
            continue
        for field in _HOOK_FIELDS:
            path = getattr(stage, field, None)
            if path is None:
                continue
            module = getattr(import_string(path), "__module__", None)  # imported by check_imports already
            if isinstance(module, str) and module not in modules:
                modules.append(module)
    return modules


def launcher_for(config: PipelineConfig, ipc_dir: Path, *, start_timeout: float) -> Launcher:
    """The launcher ``config.start_method`` asks for, for a pipeline whose IPC directory is ``ipc_dir``."""
    if config.start_method == "spawn" or not sys.platform.startswith("linux"):
        return LocalSpawnLauncher()
    # Room for the longest worker command line: a process name is at most 64 characters
    # (a replica's adds a suffix), its spec file is <name>.spec in the IPC directory.
    room = len(" ".join(worker_command(ipc_dir / ("x" * 96))))
    return TemplateLauncher(preload_modules(config), title_room=room, ready_timeout=start_timeout)
