"""The ``omni-trio`` parser, put together from each command module's part, and :func:`main`."""

from __future__ import annotations

import argparse

from omni_trio.cli import commands, run, trace
from omni_trio.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    UsageError,
    err,
    print_config_error,
)
from omni_trio.errors import ConfigError, Terminated


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``omni-trio`` with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="omni-trio",
        description="Validate and run omni-trio pipeline configs, and read their traces.",
        epilog="exit codes: 0 ok, 1 request failed, 2 usage or config error, 130 interrupted, 143 terminated",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_validate_parser(subcommands)
    run.add_parser(subcommands)
    trace.add_parser(subcommands)
    commands.add_parsers(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``omni-trio`` command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.handler(args))
    except UsageError as exc:
        err(f"error: {exc}")
        return EXIT_USAGE
    except ConfigError as exc:
        print_config_error(getattr(args, "config", "config"), exc)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_INTERRUPTED
    except Terminated:
        err("terminated (SIGTERM)")
        return EXIT_TERMINATED
