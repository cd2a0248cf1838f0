"""What the commands of ``omni-trio`` share: exit codes, usage errors, loading a config file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omni_trio.config import PipelineConfig, check_imports, load_config
from omni_trio.errors import ConfigError

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
    path = str(Path(app_dir).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)


def load(path: str) -> PipelineConfig:
    """Read and import-check a config file; ConfigError for its problems, UsageError if unreadable."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no such config file: {path}")
    try:
        config = load_config(file)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    check_imports(config)
    return config


def print_config_error(path: str, error: ConfigError) -> None:
    """Every problem of an invalid config, on stderr, under one line that names the file."""
    count = len(error.problems)
    err(f"error: invalid pipeline config {path} ({count} problem{'s' * (count != 1)}):")
    for problem in error.problems:
        err(str(problem))
