"""A caller program that the caller-death tests kill or terminate (``python -m tests.reliability.caller_program``).

``stream BASE MARKER``: a request carries a 64 MiB tensor from the caller to
stage ``a`` (process ``p_a``), which passes it to stage ``b`` (``p_b``), which
streams 64 MiB chunks back to the caller; ``MARKER`` is written once the first
chunk arrived, while more are on their way (three processes' pools in use);
the caller keeps reading slowly. ``hold BASE MARKER``: the same, but after the
first chunk the caller reads no more (its run stays alive, segments and all).

``block BASE PID_FILE``: a request waits in stage ``blocker`` (``p_block``)
until it is aborted; the stage writes ``PID_FILE`` when it starts and
``PID_FILE.aborted`` when the abort reaches it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

import omni_trio as ot

#: float32 elements in 64 MiB.
NUMEL_64MB = 16 << 20


def stream_config(base: str) -> ot.PipelineConfig:
    """Caller → a → b → caller, every hop carrying 64 MiB."""
    return ot.PipelineConfig(
        stages=[
            ot.StageConfig(name="a", factory_path="tests.stages.create_passthrough", process="p_a", next="b"),
            ot.StageConfig(name="b", factory_path="tests.stages.create_sized_streamer", process="p_b", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base),
        # A caller that reads slowly holds at most this much of the stream.
        stream_delivery=ot.StreamDeliveryConfig(max_total_backlog_bytes=192 << 20),
    )


def block_config(base: str) -> ot.PipelineConfig:
    """Caller → a → blocker, which holds the request until it is aborted."""
    return ot.PipelineConfig(
        stages=[
            ot.StageConfig(name="a", factory_path="tests.stages.create_append", factory={"tag": "a"},
                           process="p_a", next="blocker"),
            ot.StageConfig(name="blocker", factory_path="tests.stages.create_block_and_report_abort",
                           process="p_block", terminal=True),
        ],
        endpoints=ot.EndpointsConfig(base_path=base),
    )


async def stream(base: str, marker: str, hold: bool = False) -> None:
    """Stream 64 MiB chunks; write ``marker`` after the first; keep reading slowly (or hold)."""
    import torch

    params = {"chunk_numels": [NUMEL_64MB] * 40}
    async with (
        ot.open_pipeline(stream_config(base)) as pipeline,
        pipeline.stream("r0", {"x": torch.ones(NUMEL_64MB)}, params=params) as events,
    ):
        first = True
        async for _ in events:
            if first:
                Path(f"{marker}.tmp").write_text(str(os.getpid()))
                os.replace(f"{marker}.tmp", marker)
                first = False
                if hold:
                    await trio.sleep_forever()
            await trio.sleep(0.05)


async def hold(base: str, marker: str) -> None:
    """Stream until the first chunk arrived, then wait forever."""
    await stream(base, marker, hold=True)


async def block(base: str, pid_file: str) -> None:
    """Submit one request that blocks until aborted."""
    async with ot.open_pipeline(block_config(base)) as pipeline:
        await pipeline.submit("r0", "x", params={"pid_file": pid_file})


def main() -> None:
    """``python -m tests.reliability.caller_program stream|hold|block BASE FILE``."""
    mode, base, path = sys.argv[1:]
    trio.run({"stream": stream, "hold": hold, "block": block}[mode], base, path)


if __name__ == "__main__":
    main()
