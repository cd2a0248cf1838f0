"""``omni-trio serve CONFIG``: open the pipeline, serve it until SIGINT/SIGTERM, drain, close."""

from __future__ import annotations

import functools
import os
import signal
import sys
from typing import TextIO

import trio

from omni_trio.config import PipelineConfig
from omni_trio.runtime.heap import freeze_startup_heap
from omni_trio.runtime.pipeline import open_pipeline
from omni_trio.serve import serve_http
from omni_trio.serve.server import serve_config_of


async def serve_until_signalled(
    config: PipelineConfig, *, host: str, port: int, trace: str | os.PathLike[str] | None, out: TextIO
) -> None:
    """Serve ``config``'s pipeline; print ``listening on URL`` once it accepts requests.

    The first SIGINT or SIGTERM stops accepting connections and lets requests
    in flight finish within the grace period (then aborts them); the pipeline
    then closes, leaving no worker process, socket or shared memory behind. A
    signal during start-up stops at once. The signal is acknowledged with one line on stderr.
    """
    grace_period_s = serve_config_of(config).grace_period_s  # no serve table: fail before starting anything
    shutdown = trio.Event()
    listening = False
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:

            async def on_signal() -> None:
                async for _ in signals:
                    shutdown.set()
                    if not listening:
                        outer.cancel_scope.cancel()
                    else:
                        print(f"shutting down: requests in flight have {grace_period_s:g} s to finish",
                              file=sys.stderr, flush=True)
                    return

            outer.start_soon(on_signal)
            async with open_pipeline(config, trace=trace) as pipeline, trio.open_nursery() as server:
                address = await server.start(functools.partial(serve_http, pipeline, config, host=host, port=port,
                                                               shutdown=shutdown))
                listening = True
                # This process is ours: its start-up heap (torch, the app) leaves the full collections.
                freeze_startup_heap()
                print(f"listening on {address.url}", file=out, flush=True)
            outer.cancel_scope.cancel()
