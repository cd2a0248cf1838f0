"""Render a timeline exported by ``omni-trio trace export`` as a PNG (a Gantt chart).

Needs matplotlib (not a dependency of omni-trio: ``.venv/bin/pip install matplotlib``)::

    python -m examples.omni_speech --audio --placement processes --concurrency 2 --trace out/run.jsonl
    omni-trio trace export out/run.jsonl -o out/timeline.json
    python -m examples.render_timeline out/timeline.json docs/images/timeline.png

One row per process and stage track, one bar per request and stage (coloured by request),
ticks under a row for the stream chunks that stage sent or read.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def render(timeline_path: str, png_path: str, title: str) -> None:
    """Draw the slices and stream instants of a Chrome trace-event file into ``png_path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    with open(timeline_path, encoding="utf-8") as handle:
        events: list[dict[str, Any]] = json.load(handle)["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) in tracks]
    rows = sorted({(e["pid"], e["tid"]) for e in slices})
    row_of = {row: index for index, row in enumerate(rows)}
    requests = sorted({str((e.get("args") or {}).get("request_id")) for e in slices})
    colours = plt.colormaps["tab10"].colors
    colour_of = {request: colours[index % len(colours)] for index, request in enumerate(requests)}

    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.6))
    for e in slices:
        request = str((e.get("args") or {}).get("request_id"))
        ax.barh(row_of[(e["pid"], e["tid"])], e["dur"] / 1000, left=e["ts"] / 1000, height=0.6,
                color=colour_of[request], alpha=0.85)
    for e in events:
        row = row_of.get((e.get("pid"), e.get("tid")))
        if e.get("ph") == "i" and row is not None:
            ax.plot(e["ts"] / 1000, row + 0.38, "|", color="black", markersize=4, alpha=0.5)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{processes.get(pid, pid)} / {tracks[(pid, tid)]}" for pid, tid in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first event")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=colour_of[r], label=r) for r in requests], loc="lower right", title="request")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: python -m examples.render_timeline TIMELINE.json OUT.png [TITLE]")
    render(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "omni-trio timeline")
