"""Experiment 1 of the chapter: fan-out with projection, then fan-in.

Run: ``python -m examples.ch4_fanin [--placement embedded|processes]``.
"""

from __future__ import annotations

import trio

import omni_trio as ot
from examples.placement import parse_placement, process_for

M = "examples.ch4_fanin_stages"


def make_config(placement: str = "embedded") -> ot.PipelineConfig:
    """The chapter's split -> (upper, count) -> join pipeline."""
    return ot.PipelineConfig(
        model_path="toy",
        entry_stage="split",
        stages=[
            ot.StageConfig(name="split", process=process_for(placement, "p_split"), factory_path=f"{M}.create_split",
                           next=["upper", "count"],
                           project_payload={"upper": f"{M}.project_to_upper", "count": f"{M}.project_to_count"}),
            ot.StageConfig(name="upper", process=process_for(placement, "p_upper"), factory_path=f"{M}.create_upper",
                           next="join"),
            ot.StageConfig(name="count", process=process_for(placement, "p_count"), factory_path=f"{M}.create_count",
                           next="join"),
            ot.StageConfig(name="join", process=process_for(placement, "p_join"), factory_path=f"{M}.create_join",
                           wait_for=["upper", "count"], merge_fn=f"{M}.merge", terminal=True),
        ],
    )


async def run_experiment(placement: str = "embedded") -> list[str]:
    """Submit two requests concurrently; return the lines the chapter prints."""
    results: dict[int, object] = {}
    async with ot.open_pipeline(make_config(placement)) as pipeline:

        async def submit(index: int, text: str) -> None:
            results[index] = await pipeline.submit(f"r{index}", text)

        async with trio.open_nursery() as nursery:
            for index, text in enumerate(["hello omni world", "stage by stage"]):
                nursery.start_soon(submit, index, text)
    return [str(results[index]) for index in sorted(results)]


def main() -> None:
    """Print the experiment's output."""
    placement = parse_placement(__doc__ or "")
    for line in trio.run(run_experiment, placement):
        print(line)


if __name__ == "__main__":
    main()
