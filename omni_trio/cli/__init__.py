"""The ``omni-trio`` command line: validate and run pipeline configs, read traces, serve, join, bench.

Commands (see docs/cli.md)::

    omni-trio validate CONFIG
    omni-trio run CONFIG --input TEXT|@FILE [--stream] [--trace FILE] [--json] [--request-id ID] [--deadline S]
    omni-trio trace summary TRACE
    omni-trio trace export TRACE -o timeline.json
    omni-trio serve CONFIG [--host 127.0.0.1] [--port 8000] [--deadline S] [--trace FILE]
    omni-trio worker --join tcp://HOST:PORT --key KEYFILE
    omni-trio bench [--quick] [--json PATH] [--only W1,W4,...]
    omni-trio reclaim [--base DIR ...]

Exit codes: 0 ok, 1 the request failed (or the pipeline did), 2 a usage or
config error, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM; the pipeline
was shut down as on Ctrl-C). Errors go to stderr.

One module per group of commands, each with its arguments (:mod:`.run`,
:mod:`.trace`, :mod:`.commands`); :mod:`.parser` puts them together and
:mod:`.common` holds what they share.
"""

from omni_trio.cli.parser import build_parser, main
from omni_trio.cli.run import json_default

__all__ = ["build_parser", "json_default", "main"]
