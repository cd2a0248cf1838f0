"""The serving model with no runtime at all: ``python -m benchmarks.serving_floor [--concurrency 1,4,8,16]``.

How early can any runtime deliver first audio with :mod:`benchmarks.serving_model`'s talker and
vocoder? One thread runs the talker's steps (the same :class:`~benchmarks.serving_model.TalkerStep`,
sleeping ``--step-ms + --step-ms-per-request x batch``) and vocodes each frame at once (the same
:class:`~benchmarks.serving_model.VocoderModel`, one torch thread); N clients resubmit the moment
their last chunk is made, so every request joins the very next step and nothing is ever sent
anywhere. The time from a request's arrival to its first chunk is then the least any runtime can
achieve at that load: no process hops, no queues, no join wait. Printed per load: that first-audio
time, p50 and max (ms), over ``--rounds`` utterances per client.

``--random-phase``: each request arrives at a random moment of the step that is running (uniformly),
and joins the step after it. That is where the requests of closed-loop clients arrive once the
clients are out of step with each other, as they are in any runtime: a client's next request comes
a round trip after its last chunk was made, while the other streams keep the talker stepping, and
no runtime can add a request to a step already running. Its first audio then waits out the rest of
that step: the floor of a busy talker's first audio.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from benchmarks.measure import percentiles_ms
from benchmarks.serving_model import StepCost, TalkerState, TalkerStep, VocoderModel


def floor_ms(
    concurrency: int, rounds: int, frames: int, cost: StepCost, *, random_phase: bool = False, seed: int = 0
) -> list[float]:
    """First-audio times (ms) of ``concurrency`` closed-loop clients, ``rounds`` utterances each (with
    ``random_phase``, each arrival at a random moment of the step before the one it joins)."""
    step, vocoder = TalkerStep(cost), VocoderModel()
    rng = random.Random(seed)
    arrived: dict[str, float] = {}
    firsts: list[float] = []
    left = dict.fromkeys(range(concurrency), rounds)
    batch: list[TalkerState] = []

    def arrive(client: int) -> None:
        request_id = f"c{client}-{left[client]}"
        # Out of phase, it came while the step before this one ran, and waited out the rest of it.
        waited = rng.random() * cost.seconds(concurrency) if random_phase else 0.0
        arrived[request_id] = time.perf_counter() - waited
        batch.append(TalkerState(request_id, frames))

    for client in range(concurrency):
        arrive(client)
    while batch:
        for state, frame in zip(list(batch), step(batch), strict=True):
            vocoder(frame)
            if state.made == 1:
                firsts.append((time.perf_counter() - arrived[state.request_id]) * 1000)
            if state.done:
                batch.remove(state)
                client = int(state.request_id[1:].split("-")[0])
                left[client] -= 1
                if left[client]:
                    arrive(client)
    return firsts


def main(argv: list[str] | None = None) -> int:
    """Print the first-audio floor at each load."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,4,8,16", help="concurrent streams (comma-separated)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=StepCost().base_ms)
    parser.add_argument("--step-ms-per-request", type=float, default=StepCost().per_request_ms)
    parser.add_argument("--random-phase", action="store_true",
                        help="each request arrives at a random moment of a running step (see the module docstring)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cost = StepCost(args.step_ms, args.step_ms_per_request)
    for concurrency in (int(value) for value in args.concurrency.split(",")):
        firsts = floor_ms(concurrency, args.rounds, args.frames, cost, random_phase=args.random_phase)
        ranks = percentiles_ms([first / 1000 for first in firsts])
        step_ms = cost.seconds(concurrency) * 1000
        print(f"{concurrency:>3} streams: first audio p50 {ranks['p50_ms']:.1f} ms, "
              f"p99 {ranks['p99_ms']:.1f} ms, max {max(firsts):.1f} ms (a step: {step_ms:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
