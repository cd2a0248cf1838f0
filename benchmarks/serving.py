"""``python -m benchmarks serving``: what listeners hear when many people talk at once.

A streaming pipeline shaped like an omni model's speech half (:mod:`benchmarks.serving_stages`: an
iteration-level batching talker, a vocoder making 80 ms PCM16 chunks, each in a worker process) is
driven in process (``pipeline.stream``) and over HTTP (``omni-trio serve``, ``POST /v1/audio/speech``
streaming raw audio, httpx) with N concurrent streams (``--concurrency``, each client streaming
``--rounds`` utterances back to back) and Poisson arrivals (``--rates`` per second for ``--duration``
seconds). Per run: time to first audio p50/p90/p99, gap-free rate at 50/100/200 ms tolerance, underrun
seconds, goodput, refusals, CPU seconds per stream of every process (:mod:`benchmarks.serving_metrics`
says exactly how each is computed). Writes JSON (``--json``) and PNG plots (``--plot DIR``, matplotlib).
``--vs-sglang-omni`` runs the same stage code on SGLang-Omni after each of our runs
(:mod:`benchmarks.serving_sglang`). Lab notes: ``benchmarks/SERVING_NOTES.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import attrs
import trio

from benchmarks.serving_drivers import HttpDriver, InProcessDriver, measure_load
from benchmarks.serving_metrics import TOLERANCES_MS, run_entry
from benchmarks.serving_model import SAMPLE_RATE
from benchmarks.serving_stages import PipelineShape

DRIVERS = {"inproc": InProcessDriver, "http": HttpDriver}


def _numbers(text: str, kind: type) -> list[Any]:
    """A comma-separated list of positive numbers ("" for none)."""
    numbers = [kind(part) for part in text.split(",") if part.strip()]
    if any(number <= 0 for number in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be positive (an empty list runs none)")
    return numbers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The arguments of ``python -m benchmarks serving``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small loads and short utterances (well under a minute)")
    parser.add_argument("--concurrency", type=lambda s: _numbers(s, int), metavar="LIST",
                        help="concurrent streams (default 1,4,8,16,32,64; --quick: 1,4)")
    parser.add_argument("--rates", type=lambda s: _numbers(s, float), metavar="LIST",
                        help="Poisson arrival rates per second (default 4,8,16; --quick: 4)")
    parser.add_argument("--rounds", type=int, help="utterances per client at each concurrency (default 2; --quick: 1)")
    parser.add_argument("--duration", type=float, help="seconds of arrivals per rate (default 20; --quick: 1.5)")
    parser.add_argument("--drivers", default="inproc,http", help="inproc, http or both (default: both)")
    parser.add_argument("--frames", type=int, help="codec frames (80 ms each) per utterance (default 40; --quick: 12)")
    parser.add_argument("--max-batch", type=int, default=32, help="the talker's largest batch (default 32)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="talker step time at batch 0, ms (default 10)")
    parser.add_argument("--step-ms-per-request", type=float, default=0.5,
                        help="talker step time added per request in the batch, ms (default 0.5)")
    parser.add_argument("--max-in-flight", type=int, default=64,
                        help="requests admitted at once, then 429 / QueueFullError (default 64; 0: no limit)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the Poisson arrivals")
    parser.add_argument("--json", default="out/serving.json", metavar="PATH", help="where to write the results")
    parser.add_argument("--plot", metavar="DIR", help="write PNG plots (matplotlib) into DIR")
    parser.add_argument("--vs-sglang-omni", action="store_true",
                        help="run the same stage code on SGLang-Omni after each of our runs (in process only)")
    args = parser.parse_args(argv)
    q = args.quick
    args.concurrency = args.concurrency if args.concurrency is not None else ([1, 4] if q else [1, 4, 8, 16, 32, 64])
    args.rates = args.rates if args.rates is not None else ([4.0] if q else [4.0, 8.0, 16.0])
    args.rounds = args.rounds or (1 if q else 2)
    args.duration = args.duration or (1.5 if q else 20.0)
    args.frames = args.frames or (12 if q else 40)
    args.drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    unknown = [d for d in args.drivers if d not in DRIVERS]
    if unknown:
        parser.error(f"unknown driver(s) {', '.join(unknown)}; choose from {', '.join(DRIVERS)}")
    return args


def loads_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The loads to run, in order: the concurrencies, then the rates."""
    return ([{"kind": "concurrency", "value": n, "rounds": args.rounds} for n in args.concurrency]
            + [{"kind": "rate", "value": r, "duration_s": args.duration} for r in args.rates])


async def run_all(args: argparse.Namespace, shape: PipelineShape) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every driver at every load; with ``--vs-sglang-omni`` SGLang-Omni's run of each load right after ours."""
    runs: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for name in args.drivers:
        print(f"serving: starting the {name} driver...", file=sys.stderr, flush=True)
        async with DRIVERS[name](shape) as driver:
            await driver.one(f"warm-{name}")
            for index, load in enumerate(loads_of(args)):
                label = f"{name}-{load['kind']}-{load['value']}"
                records, wall, cpu = await measure_load(driver, load, label, args.seed + index)
                runs.append(run_entry("omni-trio", name, load, records, wall, cpu, SAMPLE_RATE))
                print(f"  {label}: {_line(runs[-1])}", file=sys.stderr, flush=True)
                if args.vs_sglang_omni and name == "inproc":
                    from benchmarks import serving_sglang

                    try:
                        runs.append(await serving_sglang.run_load(shape, load, args.seed + index))
                        print(f"  {label} on sglang-omni: {_line(runs[-1])}", file=sys.stderr, flush=True)
                    except Exception as exc:  # noqa: BLE001 - one failed run must not hide the others
                        errors[f"sglang-omni {label}"] = f"{type(exc).__name__}: {exc}"
                        print(f"  {label} on sglang-omni failed: {exc}", file=sys.stderr, flush=True)
    return runs, errors


def _line(run: dict[str, Any]) -> str:
    ttfp = run["ttfp_ms"] or {"p50_ms": float("nan"), "p99_ms": float("nan")}
    free = "/".join(f"{run['gap_free_rate'][str(t)] or 0:.2f}" for t in TOLERANCES_MS)
    refused = f" (p99 {run['refusal_ms']['p99_ms']:.1f} ms)" if run.get("refusal_ms") else ""
    return (f"{run['completed']}/{run['streams']} ok, {run['refused']} refused{refused}, {run['failed']} failed; "
            f"TTFP p50 {ttfp['p50_ms']:.0f} ms p99 {ttfp['p99_ms']:.0f} ms; gap-free@50/100/200 {free}; "
            f"goodput@100 {run['goodput_per_s']['100']:.2f}/s; "
            f"CPU {run['cpu_s_per_stream']['total'] * 1000:.0f} ms/stream")


def plot(runs: list[dict[str, Any]], folder: Path) -> list[Path]:
    """TTFP p50/p99 and the gap-free rates against load, one PNG of each per load kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, axis in (("concurrency", "concurrent streams"), ("rate", "arrivals per second (Poisson)")):
        chosen = [run for run in runs if run["load"]["kind"] == kind]
        if not chosen:
            continue
        series = sorted({(run["runtime"], run["driver"]) for run in chosen})
        for what in ("ttfp", "gap_free"):
            figure, ax = plt.subplots(figsize=(7, 4.5))
            for runtime, driver in series:
                mine = sorted((run for run in chosen if (run["runtime"], run["driver"]) == (runtime, driver)),
                              key=lambda run: run["load"]["value"])
                x = [run["load"]["value"] for run in mine]
                if what == "ttfp":
                    for key, style in (("p50_ms", "-o"), ("p99_ms", "--^")):
                        ax.plot(x, [(run["ttfp_ms"] or {}).get(key, float("nan")) for run in mine], style,
                                label=f"{runtime} {driver} {key[:3]}")
                else:
                    for tol, style in zip(TOLERANCES_MS, ("-o", "--s", ":^"), strict=True):
                        ax.plot(x, [run["gap_free_rate"][str(tol)] for run in mine], style,
                                label=f"{runtime} {driver} {tol} ms")
            ax.set_xlabel(axis)
            ax.set_ylabel("time to first audio (ms)" if what == "ttfp" else "gap-free streams (share)")
            if what == "gap_free":
                ax.set_ylim(-0.02, 1.02)
            if kind == "concurrency":
                ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
            path = folder / f"serving_{what}_{kind}.png"
            figure.tight_layout()
            figure.savefig(path, dpi=110)
            plt.close(figure)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the serving benchmark; 0 when every run ran (refusals are not failures), 1 otherwise, 2 when
    ``--vs-sglang-omni`` is asked for but SGLang-Omni cannot run here."""
    args = parse_args(argv)
    if args.vs_sglang_omni:
        from benchmarks import sglang as bench_sglang

        problem = bench_sglang.unavailable_message()
        if problem is not None:
            print(problem, file=sys.stderr)
            return 2
    shape = PipelineShape(max_batch=args.max_batch, frames=args.frames, step_base_ms=args.step_ms,
                          step_per_request_ms=args.step_ms_per_request, max_in_flight=args.max_in_flight or None)
    runs, errors = trio.run(run_all, args, shape)
    document = {
        "benchmark": "serving", "quick": args.quick, "python": platform.python_version(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "shape": attrs.asdict(shape),
        "sample_rate": SAMPLE_RATE, "tolerances_ms": list(TOLERANCES_MS), "runs": runs, "errors": errors,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    if args.plot:
        for written in plot(runs, Path(args.plot)):
            print(f"wrote {written}", file=sys.stderr)
    return 1 if errors or any(run["failed"] for run in runs) else 0
