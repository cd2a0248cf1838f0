"""Speak: stream text (and an optional synthetic tone) through the omni_speech pipeline, write a WAV.

Run from the repository root::

    python -m examples.omni_speech --audio --out out/demo.wav
    python -m examples.omni_speech --placement processes --concurrency 4

It prints the time to first audio and the real-time factor of each request,
writes the first request's audio to ``--out``, and prints a per-stage time
breakdown read back from the trace (``--trace``, else a temporary file, removed at exit). The
models' weights are random (see :mod:`examples.omni_speech.models`). Ctrl-C prints ``interrupted``
and exits 130.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from examples.omni_speech.pipeline import (
    PLACEMENTS,
    Speech,
    describe,
    exit_after,
    make_config,
    remove_trace,
    run_demo,
    speak,
    write_wav,
)
from examples.omni_speech.stages import MAX_NEW_TOKENS


async def run(args: argparse.Namespace, trace: Path) -> tuple[list[Speech], float]:
    """Open the pipeline, stream ``args.concurrency`` requests at once; return them and the start-up time."""
    audio: dict[str, Any] | None = {"seconds": args.audio_seconds, "freq_hz": args.tone_hz} if args.audio else None
    started = time.monotonic()
    async with ot.open_pipeline(make_config(args.placement), trace=trace) as pipeline:
        ready = time.monotonic() - started
        speeches: dict[int, Speech] = {}

        async def one(index: int) -> None:
            speeches[index] = await speak(pipeline, f"r{index}", args.text, audio=audio, max_new_tokens=args.tokens)

        async with trio.open_nursery() as nursery:
            for index in range(args.concurrency):
                nursery.start_soon(one, index)
    return [speeches[i] for i in range(args.concurrency)], ready


def main() -> None:
    """Parse the options, run, print the report."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.omni_speech", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--text", default="Hello from omni-trio! Say something nice.", help="the request's text")
    parser.add_argument("--audio", action="store_true", help="add a synthetic tone as audio input")
    parser.add_argument("--audio-seconds", type=float, default=1.0, help="length of the tone (default 1.0)")
    parser.add_argument("--tone-hz", type=float, default=440.0, help="pitch of the tone (default 440)")
    parser.add_argument("--tokens", type=int, default=MAX_NEW_TOKENS, help=f"tokens to generate ({MAX_NEW_TOKENS})")
    parser.add_argument("--placement", choices=PLACEMENTS, default="embedded",
                        help="embedded: all stages here; processes: one worker process per model")
    parser.add_argument("--concurrency", type=int, default=1, help="requests to stream at once (default 1)")
    parser.add_argument("--out", type=Path, help="write the first request's audio to this WAV file")
    parser.add_argument("--trace", type=Path, help="trace file (default: a temporary file)")
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if not args.text.strip():
        parser.error("--text must not be empty")

    if args.trace:
        remove_trace(args.trace)
        report(args, args.trace)
        return
    with tempfile.TemporaryDirectory(prefix="omni-speech-") as folder:
        report(args, Path(folder) / "trace.jsonl")


def report(args: argparse.Namespace, trace: Path) -> None:
    """Run the requests, tracing to ``trace``, and print what they did."""
    speeches, ready = run_demo(run, args, trace)

    source = f"text + {args.audio_seconds:g} s tone at {args.tone_hz:g} Hz" if args.audio else "text only"
    print(f"omni_speech, {args.placement} placement: {args.concurrency} request(s), {source}")
    print("(the models' weights are random: the pipeline is real, what it says and sounds like is noise)")
    print(f"pipeline ready in {ready:.2f} s")
    for speech in speeches:
        result = speech.result or {}
        print(f"{speech.request_id}: {result.get('tokens')} tokens -> {result.get('frames')} frames -> "
              f"{result.get('samples')} samples ({speech.audio_s:.2f} s of audio); "
              f"first audio after {speech.time_to_first_audio_s * 1000:.0f} ms, done in {speech.wall_s * 1000:.0f} ms, "
              f"real-time factor {speech.real_time_factor:.3f}"
              + (f", audio encoder batch of {result['audio_batch']}" if result.get("audio_batch") else ""))
    first = speeches[0]
    print(f"{first.request_id} says: {(first.result or {}).get('text')!r}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_wav(args.out, first.pcm, first.sample_rate)
        print(f"wrote {args.out} ({first.pcm.numel()} samples at {first.sample_rate} Hz, {first.audio_s:.2f} s)")
    where = f"trace: {trace}" if args.trace else "from its trace"
    print(f"\nwhere {first.request_id}'s time went ({where}):")
    for line in describe(first, ot.read_trace(trace)):
        print("  " + line)


if __name__ == "__main__":
    exit_after(main)
