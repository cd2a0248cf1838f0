"""The pipeline of benchmark W9 of ``python -m benchmarks``: stage replicas scale a slow stage out.

A chain ``front -> device -> back``, each in worker processes, whose middle stage blocks for
20 ms per request outside the GIL (``time.sleep`` on its scheduler thread, like a device
kernel), one request at a time per replica. 16 requests stay in flight; the chain runs with
``device.replicas`` = 1, 2 and 4, and the result is each one's requests/s and the speed-up over
one replica (benchmarks/NOTES.md). ``benchmarks.workloads.w9`` runs it.
"""

from __future__ import annotations

import time

from omni_trio.config import PipelineConfig, StageConfig
from omni_trio.payload import StagePayload
from omni_trio.scheduling import SimpleScheduler

M = "benchmarks.replicas"
#: How long the device stage holds each request, and the replica counts compared.
DEVICE_S = 0.020
REPLICAS = (1, 2, 4)
IN_FLIGHT = 16


def create_pass() -> SimpleScheduler:
    """A stage that forwards its payload, on its event loop."""
    return SimpleScheduler(lambda payload: payload, inline=True)


def _device(payload: StagePayload) -> StagePayload:
    time.sleep(DEVICE_S)  # releases the GIL, like a wait for the accelerator
    return payload


def create_device() -> SimpleScheduler:
    """A stage that holds each request for :data:`DEVICE_S` on its scheduler thread, one at a time."""
    return SimpleScheduler(_device)


def replica_chain(replicas: int) -> PipelineConfig:
    """front -> device (``replicas`` processes) -> back."""
    return PipelineConfig(
        name=f"bench-replicas{replicas}",
        stages=[
            StageConfig(name="front", process="p_front", factory_path=f"{M}.create_pass", next="device"),
            StageConfig(name="device", process="p_device", factory_path=f"{M}.create_device", next="back",
                        replicas=replicas),
            StageConfig(name="back", process="p_back", factory_path=f"{M}.create_pass", terminal=True),
        ],
    )
