"""The benchmark workloads of :mod:`benchmarks.run`, run through SGLang-Omni 0.1.9 for comparison:
the parent's side.

``python -m benchmarks --vs-sglang-omni`` runs each workload on omni-trio and then, through
:func:`run_workload`, the same workload on SGLang-Omni's own pipeline core
(``MultiProcessPipelineRunner``, its ``Coordinator``, ``SimpleScheduler`` and
``StreamingSimpleScheduler``, each stage in a spawned process of its own unless the workload says
otherwise) and prints ours-over-theirs ratios (:class:`Comparison`, :func:`table`). The stages and
workloads on SGLang-Omni's side are in :mod:`benchmarks.sglang_child`; every metric key is the
same as in ``bench.py``.

SGLang-Omni is not a dependency: it is installed in a separate virtual environment with the recipe
in ``docs/performance.md``. Its imports pull GPU-only packages, so each run happens in a child
interpreter (``python -m benchmarks.sglang_child NAME``, asyncio, as SGLang-Omni needs) whose
``PYTHONPATH`` starts with ``benchmarks/sglang_shims``: tiny modules of ours that stand in for those
imports. Nothing of SGLang-Omni's code is copied here.

``floor`` (raw pyzmq and Unix socket round trips) involves no pipeline runtime, so it has no SGLang-Omni side. One
difference is forced by SGLang-Omni's API: in ``W5`` its vocoder forwards each chunk to the caller as a
list of 8 ints, because it sends stream messages to the caller with msgpack, which refuses tensors
(ours forwards the tensor itself); the talker-to-vocoder hop carries tensors on both.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.sglang_child import RESULT_PREFIX

SGLANG_OMNI_VERSION = "0.1.9"
ROOT = Path(__file__).resolve().parent.parent
SHIMS = ROOT / "benchmarks" / "sglang_shims"
RECIPE = "docs/performance.md, section 'Reproducing them'"
NOTES: dict[str, str] = {
    "W5": "SGLang-Omni's vocoder forwards each chunk to the caller as a list (its caller-bound stream is msgpack)",
}
"""Differences forced by SGLang-Omni's API, printed under the comparison table."""
NOT_COMPARABLE: dict[str, str] = {
    "floor": "raw pyzmq and Unix socket round trips, no pipeline runtime: the same for both, not run for SGLang-Omni",
    "W9": "stage replicas: SGLang-Omni's pipeline core has no replicas of a stage, so there is nothing to compare",
    "serve": "omni-trio's own HTTP front end (ot.serve_http); SGLang-Omni's server needs its model stack, not run here",
    **{
        f"{w}-tcp": "across hosts (CURVE TCP, tensors on AES-GCM bulk connections): "
                    "SGLang-Omni's pipeline core places its stages on one host"
        for w in ("W1", "W4", "W5")
    },
    "wire-tcp": "the wire's floor (plain TCP and AES-GCM sockets), no pipeline runtime: not run for SGLang-Omni",
}
"""Workloads with no SGLang-Omni side, and why."""


# --------------------------------------------------------------------------- availability


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _child_env() -> dict[str, str]:
    """The environment of a child run: the shims, then this repository, first on ``PYTHONPATH``."""
    env = dict(os.environ)
    parts = [str(SHIMS), str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


@functools.cache
def unavailable_reason() -> str | None:
    """Why SGLang-Omni cannot run here (``None`` when it can). Checks the installed versions, then
    imports its pipeline runner in a child interpreter with the shims (a few seconds, done once)."""
    if importlib.util.find_spec("sglang_omni") is None or importlib.util.find_spec("sglang") is None:
        return "sglang_omni / sglang are not installed in this interpreter"
    version = _installed_version("sglang-omni")
    if version != SGLANG_OMNI_VERSION:
        return f"sglang-omni {version} is installed; the comparison is written for {SGLANG_OMNI_VERSION}"
    if not SHIMS.is_dir():
        return f"the import shims are missing ({SHIMS})"
    probe = subprocess.run(
        [sys.executable, "-c", "import sglang_omni.pipeline.mp_runner"],
        env=_child_env(), capture_output=True, text=True, timeout=120, check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"importing sglang_omni.pipeline.mp_runner failed: {last}"
    return None


def available() -> bool:
    """Whether SGLang-Omni 0.1.9 and its pipeline core are importable (with the shims) here."""
    return unavailable_reason() is None


# --------------------------------------------------------------------------- parent side


def run_workload(name: str, quick: bool, timeout_s: float = 900.0) -> dict[str, float]:
    """Run one workload on SGLang-Omni in a fresh child interpreter; the same metric keys as
    :func:`benchmarks.run.run_workload`. Raises ``ValueError`` for a workload it cannot express and
    ``RuntimeError`` when the child fails."""
    if name in NOT_COMPARABLE:
        raise ValueError(f"{name}: {NOT_COMPARABLE[name]}")
    command = [sys.executable, "-m", "benchmarks.sglang_child", name, *(["--quick"] if quick else [])]
    proc = subprocess.run(command, cwd=ROOT, env=_child_env(), capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX) and proc.returncode == 0:
            metrics = json.loads(line[len(RESULT_PREFIX):])
            return {key: float(value) for key, value in metrics.items()}
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    raise RuntimeError(f"SGLang-Omni run of {name} exited with {proc.returncode}:\n{tail}")


def unavailable_message() -> str | None:
    """The error ``--vs-sglang-omni`` prints when SGLang-Omni cannot run here (``None`` when it can)."""
    reason = unavailable_reason()
    if reason is None:
        return None
    return (f"--vs-sglang-omni needs SGLang-Omni {SGLANG_OMNI_VERSION} importable: {reason}. "
            f"Install it in a separate virtual environment with the recipe in {RECIPE}, "
            "and run `python -m benchmarks --vs-sglang-omni` from that environment.")


class Comparison:
    """SGLang-Omni's side of a ``--vs-sglang-omni`` run: :meth:`run` each workload right after ours
    (alternating, so that both share the machine's noise), then :meth:`table` and :meth:`document`."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.results: dict[str, dict[str, float]] = {}
        self.errors: dict[str, str] = {}
        self.notes: dict[str, str] = {}

    def run(self, name: str) -> None:
        """Run ``name`` on SGLang-Omni and record its metrics, its error, or why it has no side there."""
        if name in NOT_COMPARABLE:
            self.notes[name] = NOT_COMPARABLE[name]
            return
        print(f"running {name} on sglang-omni...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            self.results[name] = run_workload(name, self.quick)
        except Exception as exc:  # noqa: BLE001 - one failed workload must not hide the others' numbers
            self.errors[name] = f"{type(exc).__name__}: {exc}"
            print(f"  {name} on sglang-omni failed: {self.errors[name]}", file=sys.stderr, flush=True)
            return
        if name in NOTES:
            self.notes[name] = NOTES[name]
        print(f"  {name} on sglang-omni done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    def table(self, ours: dict[str, dict[str, float]]) -> str:
        """The side-by-side table, with the notes and errors under it."""
        notes = {**self.notes, **{name: f"failed on sglang-omni: {error}" for name, error in self.errors.items()}}
        return table(ours, self.results, notes)

    def document(self, ours: dict[str, dict[str, float]]) -> dict[str, Any]:
        """The JSON of SGLang-Omni's side: its metrics, errors, notes and the ours/theirs ratios."""
        return {
            "version": _installed_version("sglang-omni"),
            "workloads": self.results,
            "errors": self.errors,
            "notes": self.notes,
            "ratios_ours_over_theirs": {name: compare(ours[name], metrics)
                                        for name, metrics in self.results.items() if name in ours},
            "better": {metric: direction(metric) for metrics in self.results.values() for metric in metrics
                       if direction(metric)},
        }


def direction(metric: str) -> str:
    """``"lower"`` or ``"higher"`` when that value of ``metric`` is better; ``""`` for a metric with no
    ours/theirs ratio: counts, and W4's in-process copy/clone references (a property of the machine,
    measured on each side) and each side's transfer-over-copy ratios (shown side by side)."""
    if metric.endswith(("_copy_ms", "_clone_ms")) or "_ratio_vs_" in metric:
        return ""
    if metric.endswith("_per_s"):
        return "higher"
    if metric.endswith(("_ms", "_us")) or metric.startswith("cpu_percent"):
        return "lower"
    return ""


def ratio(ours: float, theirs: float) -> float | None:
    """``ours / theirs``, or ``None`` where it is undefined (``theirs`` is 0)."""
    if theirs == 0:
        return None
    return ours / theirs


def their_metric(metric: str) -> str:
    """The metric of SGLang-Omni's run that ours is compared with: the same one, except that W4's
    ``ot.empty`` column (``4MB_empty_latency_ms``...) is compared with their only way to send a tensor."""
    return metric.replace("_empty_", "_")


def compare(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float | None]:
    """Ours-over-theirs ratio of every metric both have that is better lower or higher."""
    return {metric: ratio(value, theirs[their_metric(metric)]) for metric, value in ours.items()
            if their_metric(metric) in theirs and direction(metric)}


def table(ours: dict[str, dict[str, float]], theirs: dict[str, dict[str, float]],
          notes: dict[str, str]) -> str:
    """The side-by-side table printed by ``--vs-sglang-omni``."""
    header = ("workload", "metric", "omni-trio", "sglang-omni", "ours/theirs", "better")
    rows: list[tuple[str, ...]] = []
    for name, metrics in ours.items():
        other = theirs.get(name, {})
        for metric, value in metrics.items():
            better = direction(metric)
            theirs_value = other.get(their_metric(metric))
            r = ratio(value, theirs_value) if theirs_value is not None and better else None
            rows.append((
                name, metric, _fmt(value),
                _fmt(theirs_value) if theirs_value is not None else "-",
                f"{r:.3f}" if r is not None else "-",
                {"lower": "lower (<1: ours)", "higher": "higher (>1: ours)"}.get(better, "")
                if theirs_value is not None else "",
            ))
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(header)]
    lines = ["  ".join(cell.ljust(widths[i]) if i in (0, 1, 5) else cell.rjust(widths[i])
                       for i, cell in enumerate(row)).rstrip() for row in [header, *rows]]
    lines += [f"{name}: {note}" for name, note in notes.items()]
    return "\n".join(lines)


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.3f}" if abs(value) < 1000 else f"{value:.1f}"
