"""Speak: stream text (and an optional synthetic tone) through the omni_speech pipeline, write a WAV.

Run from the repository root::

    python -m examples.omni_speech --audio --out out/demo.wav
    python -m examples.omni_speech --placement processes --concurrency 4

It prints the time to first audio and the real-time factor of each request,
writes the first request's audio to ``--out``, and prints a per-stage time
breakdown read back from the trace (``--trace``, else a temporary file).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import omni_trio as ot
from examples.omni_speech.pipeline import PLACEMENTS, Speech, describe, make_config, remove_trace, speak, write_wav
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


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


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

    trace = args.trace or Path(tempfile.mkdtemp(prefix="omni-speech-")) / "trace.jsonl"
    remove_trace(trace)
    try:
        speeches, ready = trio.run(run, args, trace)
    except* ot.RequestError as group:
        for error in _leaves(group):
            print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None

    source = f"text + {args.audio_seconds:g} s tone at {args.tone_hz:g} Hz" if args.audio else "text only"
    print(f"omni_speech, {args.placement} placement: {args.concurrency} request(s), {source}")
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
    print(f"\nwhere {first.request_id}'s time went (trace: {trace}):")
    for line in describe(first, ot.read_trace(trace)):
        print("  " + line)


if __name__ == "__main__":
    main()
