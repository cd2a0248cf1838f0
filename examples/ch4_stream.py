"""Experiment 3 of the chapter: a talker streaming codes into a streaming vocoder.

Run: ``python -m examples.ch4_stream [--placement embedded|processes]``.
"""

from __future__ import annotations

import trio

import omni_trio as ot
from examples.placement import parse_placement, process_for

M = "examples.ch4_stream_stages"


def make_config(placement: str = "embedded") -> ot.PipelineConfig:
    """talker --stream--> vocoder, the vocoder terminal."""
    return ot.PipelineConfig(
        model_path="toy",
        entry_stage="talker",
        stages=[
            ot.StageConfig(name="talker", process=process_for(placement, "p_talker"), factory_path=f"{M}.create_talker",
                           next="vocoder", stream_to=["vocoder"]),
            ot.StageConfig(name="vocoder", process=process_for(placement, "p_vocoder"),
                           factory_path=f"{M}.create_vocoder", terminal=True, can_accept_stream_before_payload=True),
        ],
    )


async def run_experiment(placement: str = "embedded") -> list[str]:
    """Stream one request; return the lines the chapter prints."""
    lines = []
    async with ot.open_pipeline(make_config(placement)) as pipeline, pipeline.stream("r1", "say something") as events:
        async for msg in events:
            if isinstance(msg, ot.StreamMessage):
                lines.append(f"流式块 #{msg.chunk_id} 来自 {msg.from_stage}：{msg.chunk}")
            elif isinstance(msg, ot.CompleteMessage):
                lines.append(f"完成 来自 {msg.from_stage}：{msg.result}")
    return lines


def main() -> None:
    """Print the experiment's output."""
    placement = parse_placement(__doc__ or "")
    for line in trio.run(run_experiment, placement):
        print(line)


if __name__ == "__main__":
    main()
