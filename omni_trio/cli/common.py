"""What the commands of ``omni-trio`` share: exit codes, usage errors, loading a config file, preparing a
trace file, and running a command's trio main with every start-up error as one ``error: ...`` line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from omni_trio.config import PipelineConfig, load_config
from omni_trio.errors import ConfigError, OmniTrioError, Terminated
from omni_trio.serve.address import ListenError
from omni_trio.tracing.trace import trace_files

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

APP_DIR_HELP = "directory added to sys.path for the config's dotted paths (default: the current directory)"


class UsageError(Exception):
    """A problem with the command line or its files: exit 2 with the message."""


def err(message: str) -> None:
    """Print ``message`` on stderr."""
    print(message, file=sys.stderr)


def add_app_dir_option(parser: argparse.ArgumentParser) -> None:
    """``--app-dir DIR``, which every command that imports the config's dotted paths takes."""
    parser.add_argument("--app-dir", default=".", metavar="DIR", help=APP_DIR_HELP)


def add_app_dir(app_dir: str) -> None:
    """Make the config's dotted paths importable from ``app_dir`` (default: the current directory)."""
    if not Path(app_dir).is_dir():
        raise UsageError(f"--app-dir {app_dir}: no such directory")
    path = str(Path(app_dir).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)


def load(path: str) -> PipelineConfig:
    """Read and import-check a config file; ConfigError for its problems, UsageError if unreadable."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no such config file: {path}")
    try:
        return load_config(file, imports=True)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None


def print_config_error(path: str, error: ConfigError) -> None:
    """Every problem of an invalid config, on stderr, under one line that names the file."""
    count = len(error.problems)
    err(f"error: invalid pipeline config {path} ({count} problem{'s' * (count != 1)}):")
    for problem in error.problems:
        err(str(problem))


def prepare_trace(trace: str | None) -> None:
    """Make sure ``--trace FILE`` can be written before anything starts: its directory is created, and
    UsageError says why not if it cannot be; a warning when it already holds a run's events."""
    if trace is None:
        return
    file = Path(trace)
    if file.is_dir():
        raise UsageError(f"--trace {trace} is a directory; give a file in it (e.g. {file / 'run.jsonl'})")
    if trace_files(file):
        err(f"warning: {file} exists; this run's events are appended to it (use a fresh directory per run)")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with file.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write the trace {file}: {exc}") from None


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def run_trio(config_path: str, main: Callable[..., Awaitable[int | None]], *args: Any) -> int:
    """``trio.run(main, *args)``, with what it raises (alone or in exception groups) as exit codes.

    Config problems are printed as :func:`print_config_error` does and exit 2; an address the server
    cannot listen on is one ``error:`` line and exit 2; pipeline errors are one ``error:`` line each and
    exit 1. Ctrl-C and SIGTERM are re-raised bare, for :func:`omni_trio.cli.main` to answer; anything
    else is a bug and keeps its traceback.
    """
    try:
        status = trio.run(main, *args)
    except BaseException as error:
        leaves = _leaves(error)
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in leaves):
            raise KeyboardInterrupt from None
        if any(isinstance(leaf, Terminated) for leaf in leaves):
            raise Terminated() from None
        config_errors = [leaf for leaf in leaves if isinstance(leaf, ConfigError)]
        if config_errors and len(config_errors) == len(leaves):
            print_config_error(config_path, ConfigError([p for leaf in config_errors for p in leaf.problems]))
            return EXIT_USAGE
        listen_errors = [leaf for leaf in leaves if isinstance(leaf, ListenError)]
        if listen_errors and len(listen_errors) == len(leaves):
            for listen_error in listen_errors:
                err(f"error: {listen_error.strerror}")
            return EXIT_USAGE
        if leaves and all(isinstance(leaf, OmniTrioError) for leaf in leaves):
            for leaf in leaves:
                err(f"error: {leaf}")
            return EXIT_FAILED
        raise
    return EXIT_OK if status is None else status
