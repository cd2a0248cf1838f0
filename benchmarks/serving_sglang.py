"""``python -m benchmarks serving --vs-sglang-omni``: the parent's side of SGLang-Omni's runs.

Each load runs right after ours (ours, theirs, ours, theirs ...) in a fresh child interpreter,
``python -m benchmarks.serving_sglang_child`` (:mod:`benchmarks.serving_sglang_child`), with the same
shape, the same stage code and the same Poisson arrivals (same seed); its raw streams come back as JSON
and go through the same arithmetic as ours (:func:`benchmarks.serving_metrics.summarize`). Only the
in-process driver has an SGLang-Omni side: its HTTP server (``sglang_omni.serve``) needs its model stack
(see ``benchmarks/SERVING_NOTES.md``). The child's environment is :mod:`benchmarks.sglang`'s (the import
shims first on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import attrs
import trio

from benchmarks import sglang as bench_sglang
from benchmarks.serving_metrics import StreamRecord, run_entry
from benchmarks.serving_model import SAMPLE_RATE
from benchmarks.serving_sglang_child import RESULT_PREFIX
from benchmarks.serving_stages import PipelineShape


async def run_load(shape: PipelineShape, load: dict[str, Any], seed: int, timeout_s: float = 900.0) -> dict[str, Any]:
    """One load on SGLang-Omni: the same JSON entry as ours (``runtime: "sglang-omni"``, ``driver: "inproc"``)."""
    command = [sys.executable, "-m", "benchmarks.serving_sglang_child",
               json.dumps(attrs.asdict(shape)), json.dumps(load), str(seed)]
    with trio.fail_after(timeout_s):
        proc = await trio.run_process(command, cwd=bench_sglang.ROOT, env=bench_sglang._child_env(),
                                      capture_stdout=True, capture_stderr=True, check=False)
    stdout = proc.stdout.decode(errors="replace")
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX) and proc.returncode == 0:
            result = json.loads(line[len(RESULT_PREFIX):])
            records = [StreamRecord(sent, [(t, n) for t, n in arrivals], finished, outcome, error)
                       for sent, arrivals, finished, outcome, error in result["records"]]
            return run_entry("sglang-omni", "inproc", load, records, result["wall_s"], result["cpu_s"],
                             SAMPLE_RATE)
    tail = "\n".join((stdout + proc.stderr.decode(errors="replace")).strip().splitlines()[-15:])
    raise RuntimeError(f"SGLang-Omni's serving run exited with {proc.returncode}:\n{tail}")
