"""Experiment 2 of the chapter: the batching window, armed at once or on the second request.

Run: ``python -m examples.ch4_batch [--placement embedded|processes]``.
"""

from __future__ import annotations

import time

import trio

import omni_trio as ot
from examples.placement import parse_placement, process_for

WINDOW_MS = 200


def make_config(wait_when_idle: bool, placement: str = "embedded") -> ot.PipelineConfig:
    """One batching encoder stage with a 200 ms window."""
    return ot.PipelineConfig(
        model_path="toy",
        entry_stage="encoder",
        stages=[
            ot.StageConfig(name="encoder", process=process_for(placement, "p_enc"), terminal=True,
                           factory_path="examples.ch4_batch_stages.create_encoder",
                           factory={"max_batch_wait_ms": WINDOW_MS, "batch_wait_when_idle": wait_when_idle}),
        ],
    )


async def run(wait_when_idle: bool, placement: str = "embedded") -> list[str]:
    """A burst of 4 requests, then a lone one; return the lines the chapter prints."""
    async with ot.open_pipeline(make_config(wait_when_idle, placement)) as pipeline:
        results: dict[int, dict[str, int]] = {}

        async def submit(index: int) -> None:
            results[index] = await pipeline.submit(f"burst-{index}", index)

        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(submit, index)
        t0 = time.perf_counter()
        lone = await pipeline.submit("lone", 0)
        waited = (time.perf_counter() - t0) * 1000
    return [
        f"batch_wait_when_idle={wait_when_idle}",
        f"  同时到达的 4 个请求，各自所在批的大小： {[results[i]['batch_size'] for i in range(4)]}",
        f"  单独一个请求：批大小 {lone['batch_size']}，多等了 200 ms 吗：{waited >= 180}",
    ]


async def run_experiment(placement: str = "embedded") -> list[str]:
    """Both settings, as the chapter runs them."""
    return await run(True, placement) + await run(False, placement)


def main() -> None:
    """Print the experiment's output."""
    placement = parse_placement(__doc__ or "")
    for line in trio.run(run_experiment, placement):
        print(line)


if __name__ == "__main__":
    main()
